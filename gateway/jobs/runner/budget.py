"""What a run may write: a Budget the runner charges before every byte it writes to OUTPUT
(result parts, output files, markers) and credits when it deletes what it wrote. A job whose
output is the gateway's job store charges the store's bound (GATEWAY_JOB_STORE_MAX_BYTES,
gateway.jobs.control.store_budget); past it the write is not made and the job fails
RESOURCE_EXHAUSTED naming the setting. The command-line runner writes where its operator
says: no budget.
"""

from __future__ import annotations

from typing import Protocol

from gateway.jobs.runner.dataset_limits import LimitExceeded


class BudgetSpent(LimitExceeded):
    """The bytes about to be written do not fit; the message names the bound's setting."""


class Budget(Protocol):
    def reserve(self, size: int) -> None:
        """Takes `size` bytes before they are written; BudgetSpent when they do not fit
        (blocking: called from the runner's I/O threads)."""

    def release(self, size: int) -> None:
        """Gives back `size` bytes once what held them is deleted."""
