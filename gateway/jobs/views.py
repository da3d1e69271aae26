"""A job as a caller sees it (its counts, per shard), and the record's last change when it
ends: counts frozen, state, error or result; and CreateBatchJob as the service takes it
(Request). Plain types: the contract (gateway.api.jobs) converts to and from them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.batch.spec import JobSpec
from gateway.batch.status import OutputStatus
from gateway.errors import GatewayError
from gateway.jobs.records import SUCCEEDED, Job


@dataclass(frozen=True)
class ShardView:
    index: int
    processed: int
    failed: int
    done: bool


@dataclass(frozen=True)
class JobView:
    """A job with its counts, as an Operation shows it."""

    job: Job
    total: int
    processed: int
    failed: int
    shards: list[ShardView]


def view(job: Job, found: OutputStatus | None) -> JobView:
    """The job's counts: from its output (`found`), or frozen in the record once it ended."""
    if found is None:
        final = job.final or {}
        shards = [ShardView(i, *s) for i, s in enumerate(final.get("shards", []))]
        return JobView(
            job,
            int(final.get("total", job.total or 0)),
            int(final.get("processed", 0)),
            int(final.get("failed", 0)),
            shards,
        )
    shards = [ShardView(i, *found.shard(i), found.shards_done[i]) for i in range(job.shards)]
    total = job.total or 0
    if all(found.shards_done) or job.state == SUCCEEDED:
        total = found.processed
    return JobView(job, max(total, found.processed), found.processed, found.failed, shards)


def freeze(job: Job, found: OutputStatus) -> None:
    """Keeps the counts in the record once the job has ended."""
    v = view(job, found)
    job.final = {
        "total": v.total,
        "processed": v.processed,
        "failed": v.failed,
        "shards": [[s.processed, s.failed, s.done] for s in v.shards],
        "codes": dict(sorted(found.codes.items())),
    }


def end(job: Job, state: str, error: GatewayError | None, found: OutputStatus) -> None:
    """The record as the job ends in `state` (SUCCEEDED, FAILED, CANCELLED)."""
    freeze(job, found)
    job.state = state
    job.end_time = time.time()
    job.set_failure(error)
    if state == SUCCEEDED:
        job.result = {
            "files": [name for _, name in job.units],
            "codes": job.final["codes"] if job.final else {},
            "total": found.processed,
        }


@dataclass(frozen=True)
class Request:
    """CreateBatchJob as the service takes it: the spec (input empty for an upload, output
    empty for the job's own area), and the request's own fields."""

    spec: JobSpec
    upload_id: str = ""
    request_id: str = ""
