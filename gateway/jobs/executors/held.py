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
from gateway.jobs.runner.fence import until_in_time


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
        return await self._confirm(job_id, self._leases.renew) is not None

    async def holds(self, job_id: str) -> bool:
        """The job's lease is still this process's, read in the store (a fence); when it is
        not, it is forgotten here."""
        return await self.held_until(job_id) > 0

    async def held_until(self, job_id: str) -> float:
        """Until when (time.time()) the job's lease is this process's, read in the store (a
        fence); 0.0 when it is not, and then it is forgotten here. A commit made on this
        answer is made before that time or not at all (a process stalled between the answer
        and its write must not write after another holder took over)."""
        leases = self._leases
        lease = await self._confirm(job_id, lambda held: held if leases.holds(held) else None)
        return 0.0 if lease is None else lease.expires

    async def _confirm(self, job_id: str, ask: Callable[[Lease], Lease | None]) -> Lease | None:
        """`ask(lease)` in the store under the job's lock: the lease it gives back is held
        from then on; None (the lease was lost) forgets the job."""
        lock = self._locks.get(job_id)
        if lock is None:
            return None
        async with lock:
            lease = self._held.get(job_id)
            if lease is None:
                return None
            confirmed = await asyncio.to_thread(ask, lease)
            if confirmed is None:
                self.pop(job_id)
                return None
            if job_id in self._held:
                self._held[job_id] = confirmed
            return confirmed

    def fence(self, job_id: str, loop: asyncio.AbstractEventLoop) -> ThreadFence:
        """The fence for writes this process makes from a thread (finalizing a job)."""
        return ThreadFence(self, job_id, loop)


class ThreadFence:
    def __init__(self, held: Held, job_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self._held = held
        self._job_id = job_id
        self._loop = loop

    def check(self) -> None:
        ask = asyncio.run_coroutine_threadsafe(self._held.held_until(self._job_id), self._loop)
        until_in_time(ask.result())
