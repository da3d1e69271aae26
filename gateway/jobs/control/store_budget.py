"""The job store's tally (gateway.jobs.control.tally) as the batch runner's Budget
(gateway.jobs.runner.budget): every result byte a job writes into the store is charged to the
tally first, by conditional write, so the store never passes GATEWAY_JOB_STORE_MAX_BYTES
because of results, across processes and replicas; a job whose next write does not fit
fails RESOURCE_EXHAUSTED naming the setting. Bytes the runner deletes (the parts an output
file replaces) are given back at once, from the tally and from the job's `charged`.
"""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.jobs.control.store import JobStore
from gateway.jobs.runner.budget import BudgetSpent
from gateway.jobs.spec.records import Job


class TallyBudget:
    def __init__(self, store: JobStore, job_id: str) -> None:
        self._store = store
        self._job_id = job_id
        self._charges = store.budget(job_id)

    def reserve(self, size: int) -> None:
        try:
            self._charges.charge(size)
        except GatewayError as e:
            raise BudgetSpent(e.message) from None

    def release(self, size: int) -> None:
        given: list[int] = []

        def take_back(job: Job) -> bool:
            given.append(min(size, job.charged))
            job.charged -= given[0]
            return given[0] > 0

        self._store.update(self._job_id, take_back)
        if given and given[0] > 0:
            self._store.tally.release(given[0])

    def close(self) -> None:
        """Gives back what was reserved ahead and not written."""
        self._charges.close()
