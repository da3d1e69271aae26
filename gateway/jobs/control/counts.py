"""A job's counts, read from its output (gateway.jobs.runner.progress), as a caller sees them
(JobView), and the record's last change when the job ends: counts frozen, state, error or
result."""

from __future__ import annotations

import time

from gateway.errors import GatewayError
from gateway.jobs.runner.progress import OutputStatus
from gateway.jobs.spec.records import SUCCEEDED, Job
from gateway.jobs.spec.views import JobView, ShardView


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
