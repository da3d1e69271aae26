"""The `local` executor: batch jobs run inside the gateway process.

Each job runs the batch runner (gateway.batch.job.run_shard, shard after shard) with the
in-process transport: images go straight to this process's pipeline through one Lane, which
starts a batch image only while fewer than `--batch-yield-threshold` online images are in
flight. So online calls keep priority, and jobs run with their own budget:
`--batch-max-running` jobs at once, `--batch-concurrency` images in flight over all of them.

The runner's checkpoints make every image land exactly once in the output, whatever stops
the gateway: on start, jobs left QUEUED or RUNNING are run again and resume where their
committed lines end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import TYPE_CHECKING

from gateway.batch import job as batch_job
from gateway.batch import sources, status, storage
from gateway.batch.in_process import InProcessTransport, Lane
from gateway.batch.output import Output
from gateway.batch.shard import RunSettings
from gateway.batch.transport import RETRY, Deliver, StopJob
from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.jobs.admission import input_guard
from gateway.jobs.records import CANCELLED, FAILED, RUNNING, SUCCEEDED, Job
from gateway.jobs.views import end

if TYPE_CHECKING:
    from gateway.jobs.service import JobService

log = logging.getLogger("gateway.jobs")

MONITOR_SECONDS = 1.0  # how often a running job looks for a cancel made elsewhere
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
        self._slots = asyncio.Semaphore(settings.batch_max_running)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancelling: set[str] = set()

    async def start(self, jobs: list[Job]) -> None:
        for job in jobs:
            if job.cancel_requested:
                await self._end(job, CANCELLED, CANCELLED_BY_CALLER)
            else:
                log.info("resuming batch job", extra={"fields": {"operation": job.name}})
                await self.submit(job)

    async def submit(self, job: Job) -> None:
        task = asyncio.create_task(self._run(job.id))
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))

    async def cancel(self, job: Job) -> None:
        task = self._tasks.get(job.id)
        if task is None:
            await self._end(job, CANCELLED, CANCELLED_BY_CALLER)
            return
        self._cancelling.add(job.id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)

    async def delete(self, job: Job) -> None:
        task = self._tasks.get(job.id)
        if task is not None:
            self._cancelling.add(job.id)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def refresh(self, job: Job) -> Job:
        return job

    async def close(self) -> None:
        """Stops the running jobs without changing their state: a restart resumes them."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one job -------------------------------------------------------------------------

    async def _end(self, job: Job, state: str, error: GatewayError | None) -> None:
        store = self._service.store
        fresh = await asyncio.to_thread(store.load, job.id)
        if fresh is None or fresh.done:
            return  # deleted, or ended by another process (a cancel through it) meanwhile
        found = await asyncio.to_thread(status.read, fresh.spec.output, fresh.units, fresh.shards)
        end(fresh, state, error, found)
        await self._service.save(fresh)
        message = error.message if error is not None else None
        log.info(
            "batch job ended",
            extra={"fields": {"operation": fresh.name, "state": state, "error": message}},
        )

    async def _run(self, job_id: str) -> None:
        try:
            async with self._slots:  # QUEUED until a slot is free
                await self._work(job_id)
        except asyncio.CancelledError:
            job = await asyncio.to_thread(self._service.store.load, job_id)
            if job_id in self._cancelling and job is not None:
                self._cancelling.discard(job_id)
                await self._end(job, CANCELLED, CANCELLED_BY_CALLER)
                return
            raise  # the gateway is stopping: the job keeps its state and resumes on restart

    async def _work(self, job_id: str) -> None:
        job = await asyncio.to_thread(self._service.store.load, job_id)
        if job is None or job.done:
            return
        try:
            job.state = RUNNING
            job.start_time = job.start_time or time.time()
            await self._service.save(job)
            for shard in range(job.shards):
                await self._shard(job, shard)
            await self._check_missing(job)
            out = Output(storage.resolve(job.spec.output))
            await asyncio.to_thread(batch_job.finalize, out)
        except GatewayError as e:
            await self._end(job, FAILED, e)
            return
        except Exception as e:
            log.exception("batch job failed", extra={"fields": {"operation": job.name}})
            await self._end(job, FAILED, GatewayError(Kind.INTERNAL, f"internal error: {e}"))
            return
        await self._end(job, SUCCEEDED, None)

    async def _shard(self, job: Job, shard: int) -> None:
        s = self._settings
        concurrency = job_concurrency(s)
        settings = RunSettings(
            shard_index=shard, checkpoint_seconds=s.batch_checkpoint_seconds, log_interval=3600.0
        )

        binding = job.spec.binding(self._service.bindings)

        def connect(deliver: Deliver) -> InProcessTransport:
            return InProcessTransport(job.spec, binding, self._lane, concurrency, deliver)

        guard = input_guard(s, job)
        failures = 0
        while True:
            work = asyncio.create_task(
                batch_job.run_shard(job.spec, connect, concurrency, settings, guard)
            )
            try:
                while not work.done():
                    await asyncio.wait({work}, timeout=MONITOR_SECONDS)
                    await self._check_cancelled(job)
                    await self._check_missing(job)
                work.result()
                return
            except StopJob as e:
                if e.kind not in RETRY:
                    raise GatewayError(e.kind, e.message) from None
                failures += 1  # the gateway's own upstream is down: try again, resumable
                log.warning("batch shard retried", extra={"fields": {"error": e.message}})
                await asyncio.sleep(random.uniform(0, min(30.0, 2.0**failures)))
            except sources.ReadError as e:
                failures += 1
                if failures >= READ_ATTEMPTS:
                    raise GatewayError(Kind.NOT_FOUND, str(e)) from None
                await asyncio.sleep(random.uniform(0, 2.0**failures))
            except (batch_job.JobError, sources.DatasetError, storage.StorageError) as e:
                raise GatewayError(Kind.PRECONDITION, str(e)) from None
            finally:
                if not work.done():
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work

    async def _check_cancelled(self, job: Job) -> None:
        """Cancel or Delete may arrive through another process sharing the job store (a
        gateway worker, another replica): the record says so."""
        fresh = await asyncio.to_thread(self._service.store.load, job.id)
        if fresh is None or fresh.cancel_requested:
            self._cancelling.add(job.id)
            raise asyncio.CancelledError

    async def _check_missing(self, job: Job) -> None:
        """Fails the job at its first input that could not be read (it vanished)."""
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
