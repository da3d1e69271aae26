"""What lets a run write: a Fence the runner checks before every commit to OUTPUT (a result
part, an output file, a marker, a deletion). The local executor's fence reads the job's
lease in the store (gateway.jobs.executors.held): a runner whose process lost the lease (it stalled
past it and another replica took the job) stops without writing, and without deleting the
new holder's files. The answer says until when the lease is held (time.time(), one host's
clock: the runner is a child of the gateway that holds the lease), and a commit is made only
before then: a gateway paused between its check and its answer (a stalled VM, SIGSTOP) gives
an answer that arrives too late to be used. The command-line runner writes where its operator
says: no fence.
"""

from __future__ import annotations

import time
from typing import Protocol

LOST = "another gateway process holds the job's lease now; this runner stopped without writing"


class LeaseLost(Exception):
    """The run may not write any more: another process holds the job now."""


class Fence(Protocol):
    def check(self) -> None:
        """Returns when the run may commit now; LeaseLost when it may not (blocking: called
        from the runner's I/O threads)."""


def until_in_time(until: float) -> None:
    """Returns when a fence's answer `until` (time.time() the lease is held until; 0: not
    held) still lets the run commit now; LeaseLost when it does not."""
    if until <= 0:
        raise LeaseLost(LOST)
    if time.time() >= until:
        raise LeaseLost(f"{LOST} (its lease ran out before the commit)")
