"""The leases one process holds for the jobs it runs (gateway.jobs.executors.local), and the fence
their runners check before each commit (gateway.jobs.runner.fence).

A renewal and a fence check of one job never overlap (one lock per job): the fence compares
the lease in the store with the version this process last wrote, so it must not read the
store between a renewal's write and this process learning the new version. A job whose
lease is lost (a renewal or a fence check found another version) is forgotten here: its
runner stops without writing, and nothing this process does for it afterwards counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.jobs.control.leases import Lease, Leases
from gateway.jobs.executors.isolated import LOST
from gateway.jobs.runner.fence import LeaseLost


class Held:
    def __init__(self, leases: Leases) -> None:
        self._leases = leases
        self._held: dict[str, Lease] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._held

    def take(self, job_id: str, lease: Lease) -> None:
        self._held[job_id] = lease
        self._locks[job_id] = asyncio.Lock()

    def pop(self, job_id: str) -> Lease | None:
        """Forgets the job's lease (to release it, or because it was lost)."""
        self._locks.pop(job_id, None)
        return self._held.pop(job_id, None)

    async def renew(self, job_id: str) -> bool:
        """Renews the job's lease; False (and forgotten) when it was lost."""
        return await self._confirm(job_id, self._leases.renew)

    async def holds(self, job_id: str) -> bool:
        """The job's lease is still this process's, read in the store (a fence); when it is
        not, it is forgotten here."""
        leases = self._leases
        return await self._confirm(job_id, lambda lease: lease if leases.holds(lease) else None)

    async def _confirm(self, job_id: str, ask: Callable[[Lease], Lease | None]) -> bool:
        """`ask(lease)` in the store under the job's lock: the lease it gives back is held
        from then on; None (the lease was lost) forgets the job."""
        lock = self._locks.get(job_id)
        if lock is None:
            return False
        async with lock:
            lease = self._held.get(job_id)
            if lease is None:
                return False
            confirmed = await asyncio.to_thread(ask, lease)
            if confirmed is None:
                self.pop(job_id)
                return False
            if job_id in self._held:
                self._held[job_id] = confirmed
            return True

    def fence(self, job_id: str, loop: asyncio.AbstractEventLoop) -> ThreadFence:
        """The fence for writes this process makes from a thread (finalizing a job)."""
        return ThreadFence(self, job_id, loop)


class ThreadFence:
    def __init__(self, held: Held, job_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self._held = held
        self._job_id = job_id
        self._loop = loop

    def check(self) -> None:
        held = asyncio.run_coroutine_threadsafe(self._held.holds(self._job_id), self._loop)
        if not held.result():
            raise LeaseLost(LOST)
