"""The end of a job, as both executors write it: the record's counts frozen from its output,
its state, error or result (gateway.jobs.control.counts.end), saved and logged."""

from __future__ import annotations

import asyncio
import logging

from gateway.errors import GatewayError
from gateway.jobs.control.counts import end
from gateway.jobs.control.service import JobService
from gateway.jobs.runner import progress as status
from gateway.jobs.runner.progress import OutputStatus
from gateway.jobs.spec.records import Job

log = logging.getLogger("gateway.jobs")


async def finish(
    service: JobService,
    job: Job,
    state: str,
    error: GatewayError | None,
    found: OutputStatus | None = None,
) -> None:
    """Ends `job` in `state` (SUCCEEDED, FAILED, CANCELLED) with the counts of its output
    (`found`, read when not given) and saves it."""
    if found is None:
        found = await asyncio.to_thread(status.read, job.spec.output, job.units, job.shards)
    end(job, state, error, found)
    await service.save(job)
    message = error.message if error is not None else None
    log.info(
        "batch job ended",
        extra={"fields": {"operation": job.name, "state": state, "error": message}},
    )
