"""What lets a run write: a Fence the runner checks before every commit to OUTPUT (a result
part, an output file, a marker, a deletion). The local executor's fence reads the job's
lease in the store (gateway.jobs.executors.held): a runner whose process lost the lease (it stalled
past it and another replica took the job) stops without writing, and without deleting the
new holder's files. The command-line runner writes where its operator says: no fence.
"""

from __future__ import annotations

from typing import Protocol


class LeaseLost(Exception):
    """The run may not write any more: another process holds the job now."""


class Fence(Protocol):
    def check(self) -> None:
        """Returns when the run may commit now; LeaseLost when it may not (blocking: called
        from the runner's I/O threads)."""
