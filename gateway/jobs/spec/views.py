"""A job as a caller sees it (its counts, per shard), and CreateBatchJob as the service takes
it (CreateJob). Plain types: the conversions (gateway.jobs.spec.conversions) make them from
the API's messages and back; the control (gateway.jobs.control.counts) fills in the counts."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job


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


@dataclass(frozen=True)
class CreateJob:
    """CreateBatchJob as the service takes it: the spec (input empty for an upload, output
    empty for the job's own area), the request's own fields, and whether it came through the
    jobs API's earlier name, detection.v1.BatchService (Job.legacy_api)."""

    spec: JobSpec
    upload_id: str = ""
    request_id: str = ""
    legacy_api: bool = False
