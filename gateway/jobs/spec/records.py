"""A batch job as the job store keeps it: its JobSpec, its owner and its state."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

from gateway.errors import GatewayError, Kind
from gateway.jobs.spec import JobSpec

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLING, CANCELLED = (
    "QUEUED",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLING",
    "CANCELLED",
)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLING, CANCELLED)


@dataclass
class Job:
    """One batch job. `spec.input` is what the runner reads (an upload's directory for an
    upload), `spec.output` where it writes (the job's own area in the store when the caller
    named none)."""

    id: str
    caller: str  # the owner: the identity of the caller that created it
    spec: JobSpec
    executor: str
    units: list[tuple[int, str]]  # (shard, result file) in input order
    total: int | None  # images, when known at creation (a directory of images)
    request_id: str = ""
    fingerprint: str = ""  # of the request, to tell a retry from a reuse of its request_id
    upload_id: str = ""
    default_output: bool = False  # spec.output is the job's own area in the store
    state: str = QUEUED
    error: dict[str, str] | None = None  # {"kind": errors.Kind value, "message": ...}
    result: dict[str, Any] | None = None  # {"files": [...], "codes": {...}, "total": n}
    final: dict[str, Any] | None = None  # counts frozen when the job ended
    create_time: float = field(default_factory=time.time)
    start_time: float | None = None
    update_time: float = field(default_factory=time.time)
    end_time: float | None = None
    cancel_requested: bool = False
    kube_job: str = ""  # the Indexed Job's name (kubernetes executor)
    # Written by the store: changes so far (every write a new version), a DeleteOperation
    # under way (the record is a tombstone its holder or the expiry sweep finishes), and the
    # result bytes charged to the store's tally (given back when the job is deleted).
    generation: int = 0
    deleted: bool = False
    charged: int = 0
    # Times the job's runner process died without ending its run (local executor): past
    # GATEWAY_BATCH_RUNNER_MAX_DEATHS the job fails as a poison job.
    runner_deaths: int = 0
    # Created through the jobs API's earlier name, detection.v1.BatchService: its Operation
    # packs detection.v1 types, as that name's clients expect, until the next release
    # (CHANGELOG.md). Written only when set, so that the records of jobs created through
    # vision.v1 stay readable by replicas of the earlier version during a rolling upgrade.
    legacy_api: bool = False

    @property
    def name(self) -> str:
        return f"operations/{self.id}"

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def shards(self) -> int:
        return self.spec.shards

    @property
    def failure(self) -> GatewayError | None:
        if self.error is None:
            return None
        return GatewayError(Kind(self.error["kind"]), self.error["message"])

    def set_failure(self, error: GatewayError | None) -> None:
        self.error = None if error is None else {"kind": error.kind.value, "message": error.message}

    def to_json(self) -> bytes:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["spec"] = self.spec.to_json()
        if not self.legacy_api:
            del data["legacy_api"]
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Job:
        """The record `to_json` wrote; ValueError for anything else."""
        data = json.loads(raw)
        try:
            data["spec"] = JobSpec.from_json(data["spec"])
            data["units"] = [(int(shard), str(name)) for shard, name in data["units"]]
            return cls(**data)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a job record: {e}") from None


def new_id() -> str:
    return uuid.uuid4().hex[:24]


def valid_id(job_id: str) -> bool:
    return 0 < len(job_id) <= 64 and all(c in "0123456789abcdef" for c in job_id)
