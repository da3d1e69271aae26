"""The `local` executor: batch jobs run inside the gateway process.

Each job runs the batch runner (gateway.batch.job.run_shard, shard after shard) against the
gateway's *batch lane*: a second gRPC server on a loopback port with the same servicers over
a `BatchLane`, which refuses a batch image (RESOURCE_EXHAUSTED, which the runner retries
with backoff) whenever online images are in flight at or above
`--batch-yield-threshold`. So online calls keep priority, and jobs run with their own budget:
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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gateway import errors
from gateway.batch import job as batch_job
from gateway.batch import runner, sources, storage
from gateway.batch.output import Output
from gateway.config import Settings
from gateway.core.domain import Outcome, Request
from gateway.core.pipeline import Pipeline
from gateway.jobs import progress
from gateway.jobs.store import CANCELLED, FAILED, RUNNING, SUCCEEDED, Job

if TYPE_CHECKING:
    from gateway.jobs.service import JobService

log = logging.getLogger("gateway.jobs")

# google.rpc.Code numbers for Operation.error
CANCELLED_CODE, NOT_FOUND_CODE, FAILED_PRECONDITION_CODE, INTERNAL_CODE = 1, 5, 9, 13
INVALID_ARGUMENT_CODE = 3
MONITOR_SECONDS = 1.0


def job_concurrency(settings: Settings) -> int:
    """Images in flight per running job: the budget shared by the jobs that may run."""
    return max(1, settings.batch_concurrency // settings.batch_max_running)


class BatchLane:
    """The pipeline as batch jobs see it: the same work, refused first when the gateway is
    busy with online requests."""

    def __init__(self, pipeline: Pipeline, yield_threshold: int) -> None:
        self._pipeline = pipeline
        # The servicers hold results until a stream's window is full or the stream ends, so
        # the lane's window is the runner's: one stream per job, all its images in flight.
        self.settings = replace(pipeline.settings, stream_window=job_concurrency(pipeline.settings))
        self.yield_threshold = yield_threshold
        self.in_flight = 0
        self.refused = 0

    async def run(self, task_name: str, request: Request) -> Outcome:
        online = self._pipeline.in_flight - self.in_flight
        if online >= self.yield_threshold:
            self.refused += 1
            raise errors.overloaded(
                f"batch work yields to {online} online images in flight; retried later"
            )
        self.in_flight += 1
        try:
            return await self._pipeline.run(task_name, request)
        finally:
            self.in_flight -= 1


class Stop(Exception):
    """The job ends with this error (google.rpc code, message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class LocalExecutor:
    name = "local"

    def __init__(self, service: JobService, settings: Settings) -> None:
        self._service = service
        self._settings = settings
        self.target = ""  # the batch lane's host:port, set by the composition root
        self._slots = asyncio.Semaphore(settings.batch_max_running)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancelling: set[str] = set()

    async def start(self, jobs: list[Job]) -> None:
        for job in jobs:
            if job.cancel_requested:
                await self._end(job, CANCELLED, CANCELLED_CODE, "cancelled by the caller")
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
            await self._end(job, CANCELLED, CANCELLED_CODE, "cancelled by the caller")
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

    async def _end(self, job: Job, state: str, code: int | None, message: str) -> None:
        fresh = await asyncio.to_thread(self._service.store.load, job.id)
        if fresh is None or fresh.done:
            return  # deleted, or ended by another process (a cancel through it) meanwhile
        found = await asyncio.to_thread(progress.read, fresh.output_url, fresh.units, fresh.shards)
        from gateway.jobs.service import freeze

        freeze(fresh, found)
        fresh.state = state
        fresh.end_time = time.time()
        fresh.error = None if code is None else {"code": code, "message": message}
        if state == SUCCEEDED:
            fresh.result = {
                "files": [name for _, name in fresh.units],
                "codes": fresh.final["codes"] if fresh.final else {},
                "total": found.processed,
            }
        await self._service.save(fresh)
        log.info(
            "batch job ended",
            extra={"fields": {"operation": fresh.name, "state": state, "error": message or None}},
        )

    async def _run(self, job_id: str) -> None:
        try:
            async with self._slots:  # QUEUED until a slot is free
                await self._work(job_id)
        except asyncio.CancelledError:
            job = await asyncio.to_thread(self._service.store.load, job_id)
            if job_id in self._cancelling and job is not None:
                self._cancelling.discard(job_id)
                await self._end(job, CANCELLED, CANCELLED_CODE, "cancelled by the caller")
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
            out = Output(storage.resolve(job.output_url))
            await asyncio.to_thread(batch_job.finalize, out)
        except Stop as e:
            await self._end(job, FAILED, e.code, e.message)
            return
        except Exception as e:
            log.exception("batch job failed", extra={"fields": {"operation": job.name}})
            await self._end(job, FAILED, INTERNAL_CODE, f"internal error: {e}")
            return
        await self._end(job, SUCCEEDED, None, "")

    def _options(self, job: Job) -> runner.Options:
        s = self._settings
        concurrency = job_concurrency(s)
        model = job.params["model"]
        return runner.Options(
            target=self.target,
            task=job.params["task"],
            model=model["name"],
            version=model["version"],
            label=model["label"],
            min_score=job.params["min_score"],
            max_detections=job.params["max_detections"],
            top_k=job.params["top_k"],
            concurrency=concurrency,
            stream_window=concurrency,
            connections=1,
            timeout=max(60.0, 2 * s.upstream_timeout),
            give_up_after=600.0,
        )

    async def _shard(self, job: Job, shard: int) -> None:
        from gateway.jobs.service import job_args

        args = job_args(job.params, job.input_url, job.output_url)
        settings = batch_job.RunSettings(
            shard_index=shard,
            checkpoint_seconds=self._settings.batch_checkpoint_seconds,
            log_interval=3600.0,
        )
        failures = 0
        while True:
            work = asyncio.create_task(batch_job.run_shard(args, self._options(job), settings))
            try:
                while not work.done():
                    await asyncio.wait({work}, timeout=MONITOR_SECONDS)
                    await self._check_cancelled(job)
                    await self._check_missing(job)
                work.result()
                return
            except runner.FatalError as e:
                if "refused the job" in str(e):
                    raise Stop(FAILED_PRECONDITION_CODE, str(e)) from None
                failures += 1  # the gateway's own upstream is down: try again, resumable
                log.warning("batch shard retried", extra={"fields": {"error": str(e)}})
                await asyncio.sleep(random.uniform(0, min(30.0, 2.0**failures)))
            except sources.ReadError as e:
                failures += 1
                if failures > 5:
                    raise Stop(NOT_FOUND_CODE, str(e)) from None
                await asyncio.sleep(random.uniform(0, 2.0**failures))
            except (batch_job.JobError, sources.DatasetError, storage.StorageError) as e:
                raise Stop(FAILED_PRECONDITION_CODE, str(e)) from None
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
        found = await asyncio.to_thread(progress.read, job.output_url, job.units, job.shards)
        if found.codes.get("NOT_FOUND", 0) == 0:
            return
        line: dict[str, Any] | None = await asyncio.to_thread(
            progress.first_line_with, job.output_url, found, "NOT_FOUND"
        )
        if line is None:
            return
        raise Stop(
            NOT_FOUND_CODE,
            f"input {line.get('source')} is missing (it vanished during the run or never "
            f"existed): {line['error'].get('message')}; the job stopped at its first missing "
            "input",
        )
