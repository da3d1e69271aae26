"""The job store: job records and uploads under one fsspec URI (`--job-store`).

Layout:

    <store>/operations/<id>.json      one job record (JSON), replaced atomically
    <store>/uploads/<upload id>/<name> images uploaded with UploadImages
    <store>/jobs/<id>/output/          a job's results when the caller named no output

Nothing is written until the first job or upload (a gateway without jobs writes no files).
A record is created with create-if-absent (a hard link on a local disk, a conditional PUT
on S3), so two replicas given the same request_id make one job.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from gateway.batch import storage

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
    """One batch job as stored. `params` are the caller's fields, normalised."""

    id: str
    caller: str
    request_id: str
    fingerprint: str
    executor: str
    params: dict[str, Any]
    input_url: str  # what the runner reads
    output_url: str  # where it writes
    default_output: bool  # output_url is the job's own area in the store
    units: list[list[Any]]  # [shard, result file] in input order
    total: int | None  # images, when known at creation (a directory of images)
    state: str = QUEUED
    error: dict[str, Any] | None = None  # {"code": google.rpc.Code number, "message": ...}
    result: dict[str, Any] | None = None  # {"files": [...], "codes": {...}, "total": n}
    final: dict[str, Any] | None = None  # counts frozen when the job ended
    create_time: float = field(default_factory=time.time)
    start_time: float | None = None
    update_time: float = field(default_factory=time.time)
    end_time: float | None = None
    cancel_requested: bool = False
    kube_job: str = ""  # the Indexed Job's name (kubernetes executor)

    @property
    def name(self) -> str:
        return f"operations/{self.id}"

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def shards(self) -> int:
        return int(self.params["shards"])

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Job:
        return cls(**json.loads(data))


class JobStore:
    def __init__(self, url: str) -> None:
        self.location = storage.resolve(url)
        self.fs = self.location.fs

    @property
    def url(self) -> str:
        return self.location.url()

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.location.path, *parts)

    def record_path(self, job_id: str) -> str:
        return self._path("operations", f"{job_id}.json")

    def area_url(self, job_id: str) -> str:
        return self.location.url(self._path("jobs", job_id, "output"))

    def upload_path(self, upload_id: str) -> str:
        return self._path("uploads", upload_id)

    def upload_url(self, upload_id: str) -> str:
        return self.location.url(self.upload_path(upload_id))

    # --- records -------------------------------------------------------------------------

    def create(self, job: Job) -> bool:
        """Writes a new record; False when one with this id exists already."""
        path = self.record_path(job.id)
        data = job.to_json()
        if isinstance(self.fs, LocalFileSystem):
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{job.id}.json")
            with open(temporary, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(temporary, path)  # atomic, fails when the record exists
            except FileExistsError:
                return False
            finally:
                os.unlink(temporary)
            return True
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def save(self, job: Job) -> None:
        job.update_time = time.time()
        storage.write_atomic(self.fs, self.record_path(job.id), job.to_json())

    def load(self, job_id: str) -> Job | None:
        if not _valid_id(job_id):
            return None
        try:
            return Job.from_json(storage.read_bytes(self.fs, self.record_path(job_id)))
        except FileNotFoundError:
            return None

    def delete(self, job_id: str) -> None:
        storage.delete(self.fs, [self.record_path(job_id)])

    def jobs(self) -> list[Job]:
        """Every record, oldest first."""
        found = []
        for path in storage.listing(self.fs, self._path("operations")):
            name = posixpath.basename(path)
            if name.startswith(".") or not name.endswith(".json"):
                continue
            with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
                found.append(Job.from_json(storage.read_bytes(self.fs, path)))
        found.sort(key=lambda j: (j.create_time, j.id))
        return found

    def remove_tree(self, url: str) -> None:
        location = storage.resolve(url)
        storage.delete(location.fs, storage.listing(location.fs, location.path))
        if isinstance(location.fs, LocalFileSystem):
            for root, _dirs, _files in sorted(os.walk(location.path), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(root)

    # --- uploads -------------------------------------------------------------------------

    def upload_size(self, upload_id: str) -> tuple[int, int]:
        """(images, bytes) already in an upload; (0, 0) when there is none."""
        files = storage.listing(self.fs, self.upload_path(upload_id))
        files = [f for f in files if not posixpath.basename(f).startswith(".")]
        return len(files), sum(int(self.fs.size(f)) for f in files)

    def put_upload(self, upload_id: str, name: str, data: bytes) -> None:
        storage.write_atomic(self.fs, posixpath.join(self.upload_path(upload_id), name), data)


def new_id() -> str:
    return uuid.uuid4().hex[:24]


def _valid_id(job_id: str) -> bool:
    return 0 < len(job_id) <= 64 and all(c in "0123456789abcdef" for c in job_id)
