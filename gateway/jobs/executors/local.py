"""The `local` executor: batch jobs run inside the gateway processes sharing the job store.

Each process looks for work in the store (the unfinished jobs, at once when it creates one,
else every third of a lease's length) and runs a job only under its lease
(control.leases), renewed while it runs, up to `--batch-max-running` jobs at once. A job
runs the batch runner (runner.job.run_shard, shard after shard) with the in-process
transport: images go straight to this process's pipeline through one Lane, which starts a
batch image only while fewer than `--batch-yield-threshold` online images are in flight. So
online calls keep priority, and jobs run with their own budget: `--batch-concurrency` images
in flight over all of a process's jobs; each job in one process at a time.

The runner's checkpoints make every image land exactly once in the output, whatever stops a
process: a job whose holder stopped (its lease released, or expired after a crash) is taken by
the next process that looks, and resumes where its committed lines end. Images run as the job's
owner (its caller): its quota, fair share and payload log (transports.in_process)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from typing import TYPE_CHECKING

from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.jobs.control.admission import input_guard, job_limits
from gateway.jobs.control.store_budget import TallyBudget
from gateway.jobs.executors.ending import finish
from gateway.jobs.executors.held import Held
from gateway.jobs.executors.isolated import Runner, RunnerDied
from gateway.jobs.runner import job as batch_job
from gateway.jobs.runner import progress as status
from gateway.jobs.runner import sources, storage
from gateway.jobs.runner.dataset_limits import ItemCount, LimitExceeded
from gateway.jobs.runner.fence import LeaseLost
from gateway.jobs.runner.output import Output
from gateway.jobs.runner.transport import RETRY, StopJob
from gateway.jobs.spec.records import CANCELLED, FAILED, RUNNING, SUCCEEDED, Job
from gateway.jobs.transports.in_process import Lane

if TYPE_CHECKING:
    from gateway.jobs.control.service import JobService

log = logging.getLogger("gateway.jobs")

MONITOR_SECONDS = 1.0  # how often a running job looks for a cancel made elsewhere
LOOK_SECONDS = 5.0  # at most this long between looks for work (less for short leases)
READ_ATTEMPTS = 5  # a dataset file that cannot be read this many times in a row fails the job
CANCELLED_BY_CALLER = GatewayError(Kind.CANCELLED, "cancelled by the caller")


def job_concurrency(settings: Settings) -> int:
    """Images in flight per running job: the budget shared by the jobs that may run."""
    return max(1, settings.batch_concurrency // settings.batch_max_running)


class LocalExecutor:
    name = "local"

    def __init__(self, service: JobService, settings: Settings, lane: Lane) -> None:
        self._service = service
        self._settings = settings
        self._lane = lane
        self._leases = service.leases
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._held = Held(self._leases)  # the leases of the jobs running here
        self._cancelling: set[str] = set()
        self._wake = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._look_every = max(0.1, min(LOOK_SECONDS, settings.job_lease_seconds / 3))
        # Each shard runs in a child process (gateway.jobs.executors.isolated): untrusted dataset
        # files are read and parsed where they cannot take online serving down.
        self.runner = Runner(settings.batch_runner_memory_bytes, settings.log_level)

    async def start(self, jobs: list[Job]) -> None:
        self._scheduler = asyncio.create_task(self._schedule())

    async def submit(self, job: Job) -> None:
        self._wake.set()

    async def _stop_here(self, job_id: str) -> bool:
        """Stops the job if this process runs it (it ends CANCELLED); False if it does not."""
        task = self._tasks.get(job_id)
        if task is None:
            return False
        self._cancelling.add(job_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
        return True

    async def cancel(self, job: Job) -> None:
        if await self._stop_here(job.id):
            return
        # Not running here: its holder, if any, sees the cancel in the record and ends it.
        lease = await asyncio.to_thread(self._leases.acquire, job.id)
        if lease is None:
            return
        try:
            await self._end(job, CANCELLED, CANCELLED_BY_CALLER)
        finally:
            await asyncio.to_thread(self._leases.release, lease)

    async def delete(self, job: Job) -> None:
        # Stopped here, it finishes the delete as it lets go of the lease; a holder elsewhere
        # sees the record's tombstone at its next look and does the same.
        await self._stop_here(job.id)

    async def refresh(self, job: Job) -> Job:
        return job

    async def close(self) -> None:
        """Stops the running jobs without changing their state and releases their leases:
        another process (or this one, restarted) resumes them."""
        if self._scheduler is not None:
            self._scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- finding work --------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._fill()
            except Exception:
                log.exception("looking for batch work failed; looked again later")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._look_every)

    async def _fill(self) -> None:
        """Takes unfinished jobs whose lease is free, oldest first, while slots are free."""
        store = self._service.store
        if len(self._tasks) >= self._settings.batch_max_running:
            return
        waiting = []
        for job_id in await asyncio.to_thread(store.active):
            if job_id in self._tasks:
                continue
            job = await asyncio.to_thread(store.live, job_id)
            if job is not None and job.executor == self.name:
                waiting.append(job)
        waiting.sort(key=lambda j: (j.create_time, j.id))
        for job in waiting:
            if len(self._tasks) >= self._settings.batch_max_running:
                return
            lease = await asyncio.to_thread(self._leases.acquire, job.id)
            if lease is None:
                continue  # another process runs it
            fresh = await asyncio.to_thread(store.load, job.id)
            if fresh is None or fresh.done:
                await asyncio.to_thread(self._leases.release, lease)
                continue
            if fresh.cancel_requested:
                await self._end(fresh, CANCELLED, CANCELLED_BY_CALLER)
                await asyncio.to_thread(self._leases.release, lease)
                continue
            self._held.take(job.id, lease)
            task = asyncio.create_task(self._run(job.id))
            self._tasks[job.id] = task
            task.add_done_callback(functools.partial(self._finished, job.id))

    def _finished(self, job_id: str, _: object) -> None:
        self._tasks.pop(job_id, None)
        self._wake.set()  # a slot is free

    async def _keep(self, job_id: str) -> None:
        """Renews the job's lease; when it is lost, stops the job here (its new holder goes
        on with it)."""
        while True:
            await asyncio.sleep(self._settings.job_lease_seconds / 3)
            if not await self._held.renew(job_id):
                log.warning("batch job lease lost", extra={"fields": {"operation": job_id}})
                task = self._tasks.get(job_id)
                if task is not None:
                    task.cancel()
                return

    # --- one job -------------------------------------------------------------------------

    async def _end(self, job: Job, state: str, error: GatewayError | None) -> None:
        """Ends the job (under its lease, held by this process)."""
        store = self._service.store
        fresh = await asyncio.to_thread(store.load, job.id)
        if fresh is None or fresh.done:
            return  # deleted, or ended by another process (a cancel through it) meanwhile
        await finish(self._service, fresh, state, error)

    async def _run(self, job_id: str) -> None:
        keeper = asyncio.create_task(self._keep(job_id))
        try:
            await self._work(job_id)
        except asyncio.CancelledError:
            if job_id not in self._cancelling:
                # The gateway is stopping or the lease was lost: the job keeps its state and
                # is resumed by whoever takes its lease.
                raise
            job = await asyncio.to_thread(self._service.store.load, job_id)
            if job is not None and job_id in self._held:
                await self._end(job, CANCELLED, CANCELLED_BY_CALLER)
        finally:
            self._cancelling.discard(job_id)
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await self._let_go(job_id)

    async def _let_go(self, job_id: str) -> None:
        lease = self._held.pop(job_id)
        if lease is None:
            return
        store = self._service.store
        if await asyncio.to_thread(store.load, job_id) is None:
            deleted = await asyncio.to_thread(store.load, job_id, True)
            if deleted is not None:  # its work stopped here: no file is written after this
                await self._service.finish_delete(deleted)
                return
        await asyncio.to_thread(self._leases.release, lease)

    async def _work(self, job_id: str) -> None:
        store = self._service.store
        job = await asyncio.to_thread(store.load, job_id)
        if job is None or job.done:
            return
        log.info(
            "batch job running",
            extra={"fields": {"operation": job.name, "replica": self._leases.holder}},
        )
        try:
            if not job.cancel_requested:  # else it ends at its first look for a cancel
                job.state = RUNNING
            job.start_time = job.start_time or time.time()
            saved = await self._service.save(job)  # a cancel made meanwhile is kept
            if saved is None or saved.done:
                return  # deleted, or ended elsewhere meanwhile
            job = saved
            await self._check_missing(job)  # one found before a restart still ends the job
            items = ItemCount(job_limits(self._settings, job))  # one count for every shard
            for shard in range(job.shards):
                await self._shard(job, shard, items)
            await self._check_missing(job)
            budget = self._budget(job)
            fence = self._held.fence(job.id, asyncio.get_running_loop())
            out = Output(storage.resolve(job.spec.output), budget, fence)
            try:
                await asyncio.to_thread(batch_job.finalize, out)
            finally:
                if budget is not None:
                    await asyncio.to_thread(budget.close)
        except LeaseLost:  # another process took the job: it goes on with it
            log.warning(
                "batch job lease lost; its runner stopped without writing",
                extra={"fields": {"operation": job.name, "replica": self._leases.holder}},
            )
            self._held.pop(job.id)
            return
        except GatewayError as e:
            await self._end_held(job, FAILED, e)
            return
        except LimitExceeded as e:  # the store's bound, as the job is finalized
            await self._end_held(job, FAILED, e.error())
            return
        except Exception as e:
            log.exception("batch job failed", extra={"fields": {"operation": job.name}})
            await self._end_held(job, FAILED, GatewayError(Kind.INTERNAL, f"internal error: {e}"))
            return
        await self._end_held(job, SUCCEEDED, None)

    async def _end_held(self, job: Job, state: str, error: GatewayError | None) -> None:
        """Ends the job unless its lease was lost meanwhile (its new holder ends it): the
        lease is checked in the store (a fence), not only in this process's memory."""
        if await self._held.holds(job.id):
            await self._end(job, state, error)

    async def _shard(self, job: Job, shard: int, items: ItemCount) -> None:
        counted = items.read  # by the shards before this one
        budget = self._budget(job)
        try:
            await self._attempts(job, shard, items, counted, budget)
        finally:
            if budget is not None:
                await asyncio.to_thread(budget.close)

    def _budget(self, job: Job) -> TallyBudget | None:
        """Results written into the job store are charged to its tally first."""
        return TallyBudget(self._service.store, job.id) if job.default_output else None

    async def _attempts(
        self, job: Job, shard: int, items: ItemCount, counted: int, budget: TallyBudget | None
    ) -> None:
        s = self._settings
        concurrency = job_concurrency(s)
        binding = job.spec.binding(self._service.bindings)
        guard = input_guard(s, job)
        failures = 0
        while True:
            items.read = counted  # an attempt again reads what the one before read
            work = asyncio.create_task(
                self.runner.run_shard(
                    job.spec,
                    binding,
                    self._lane,
                    concurrency,
                    shard,
                    s.batch_checkpoint_seconds,
                    guard,
                    items,
                    job.caller,
                    budget,
                    functools.partial(self._held.held_until, job.id),
                )
            )
            try:
                while not work.done():
                    await asyncio.wait({work}, timeout=MONITOR_SECONDS)
                    await self._check_cancelled(job)
                work.result()
                return
            except StopJob as e:
                if e.kind not in RETRY:  # a missing input, no such model, no access
                    raise GatewayError(e.kind, e.message) from None
                failures += 1  # the gateway's own upstream is down: try again, resumable
                log.warning("batch shard retried", extra={"fields": {"error": e.message}})
                await asyncio.sleep(random.uniform(0, min(30.0, 2.0**failures)))
            except sources.ReadError as e:
                failures += 1
                if failures >= READ_ATTEMPTS:
                    raise GatewayError(Kind.NOT_FOUND, str(e)) from None
                await asyncio.sleep(random.uniform(0, 2.0**failures))
            except LimitExceeded as e:
                raise e.error() from None
            except RunnerDied as e:
                await self._died(job, e)
                failures += 1
                await asyncio.sleep(random.uniform(0, min(30.0, 2.0**failures)))
            except (batch_job.JobError, sources.DatasetError, storage.StorageError) as e:
                raise GatewayError(Kind.PRECONDITION, str(e)) from None
            finally:
                if not work.done():
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work

    async def _died(self, job: Job, died: RunnerDied) -> None:
        """Counts a death of the job's runner in its record; past the limit the job is a
        poison job: it fails, naming the cause, instead of being retried forever."""
        store = self._service.store
        fresh = await asyncio.to_thread(store.load, job.id)
        if fresh is None or fresh.done:
            raise asyncio.CancelledError  # deleted or ended meanwhile
        fresh.runner_deaths += 1
        await self._service.save(fresh)
        deaths = job.runner_deaths = fresh.runner_deaths
        limit = self._settings.batch_runner_max_deaths
        log.warning(
            "batch runner died",
            extra={"fields": {"operation": job.name, "cause": died.cause, "deaths": deaths}},
        )
        if deaths >= limit:
            raise died.poison(deaths, limit)

    async def _check_cancelled(self, job: Job) -> None:
        """Cancel or Delete may arrive through another process sharing the job store (a
        gateway worker, another replica): the record says so."""
        fresh = await asyncio.to_thread(self._service.store.load, job.id)
        if fresh is None or fresh.cancel_requested:
            self._cancelling.add(job.id)
            raise asyncio.CancelledError

    async def _check_missing(self, job: Job) -> None:
        """Fails the job at its first committed input that could not be found (the runner
        stops at the first one it meets; this finds one committed before a restart)."""
        output = job.spec.output
        found = await asyncio.to_thread(status.read, output, job.units, job.shards)
        if found.codes.get("NOT_FOUND", 0) == 0:
            return
        line = await asyncio.to_thread(status.first_line_with, output, found, "NOT_FOUND")
        if line is None:
            return
        raise GatewayError(
            Kind.NOT_FOUND,
            f"input {line.get('source')} is missing (it vanished during the run or never "
            f"existed): {line['error'].get('message')}; the job stopped at its first missing "
            "input",
        )
