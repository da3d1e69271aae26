"""The job store: job records and uploads under one fsspec URI (`--job-store`), shared by
every replica.

Layout:

    <store>/operations/<id>.json       one job record (JSON), replaced atomically
    <store>/active/<id>                an unfinished job (what replicas look for work in)
    <store>/leases/<name>/<generation>.json
                                       who runs a job (or sweeps expired ones): see leases.py
    <store>/uploads/<upload id>.json   an upload's owner and times
    <store>/uploads/<upload id>/<name> its images
    <store>/jobs/<id>/output/          a job's results when the caller named no output

Nothing is written until the first job or upload (a gateway without jobs writes no files).
Records are created with create-if-absent (a hard link on a local disk, a conditional PUT
on S3), so two replicas given the same request_id make one job.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from gateway.batch import storage
from gateway.jobs.records import Job, valid_id


@dataclass
class Upload:
    id: str
    owner: str
    # Whole seconds, so rewriting the record never changes its size (the store's bound
    # counts it).
    create_time: int
    update_time: int  # the last upload call


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

    # --- files ---------------------------------------------------------------------------

    def create_file(self, path: str, data: bytes) -> bool:
        """Writes `data` to a new file; False when the file exists already (atomic: of two
        writers, one wins)."""
        if isinstance(self.fs, LocalFileSystem):
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            name = os.path.basename(path)
            temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{name}")
            with open(temporary, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(temporary, path)  # atomic, fails when the file exists
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

    def usage(self) -> int:
        """Bytes of everything in the store."""
        self.fs.invalidate_cache()
        try:
            return int(self.fs.du(self.location.path, total=True))
        except FileNotFoundError:
            return 0

    def remove_tree(self, url: str) -> None:
        location = storage.resolve(url)
        storage.delete(location.fs, storage.listing(location.fs, location.path))
        if isinstance(location.fs, LocalFileSystem):
            for root, _dirs, _files in sorted(os.walk(location.path), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(root)

    # --- records -------------------------------------------------------------------------

    def create(self, job: Job) -> bool:
        """Writes a new record; False when one with this id exists already."""
        if not self.create_file(self.record_path(job.id), job.to_json()):
            return False
        storage.write_atomic(self.fs, self._active(job.id), b"")
        return True

    def save(self, job: Job) -> None:
        job.update_time = time.time()
        storage.write_atomic(self.fs, self.record_path(job.id), job.to_json())
        if job.done:
            storage.delete(self.fs, [self._active(job.id)])

    def mark_active(self, job_ids: list[str]) -> None:
        """Adds unfinished jobs to the index (those that are there already stay)."""
        have = set(self.active())
        for job_id in job_ids:
            if job_id not in have:
                storage.write_atomic(self.fs, self._active(job_id), b"")

    def active(self) -> list[str]:
        """The ids of unfinished jobs (a job that ended or was deleted meanwhile may be among
        them: load its record)."""
        names = [posixpath.basename(p) for p in storage.listing(self.fs, self._path("active"))]
        return [n for n in names if valid_id(n)]

    def _active(self, job_id: str) -> str:
        return self._path("active", job_id)

    def load(self, job_id: str) -> Job | None:
        if not valid_id(job_id):
            return None
        try:
            return Job.from_json(storage.read_bytes(self.fs, self.record_path(job_id)))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):  # not a record this version can read
            return None

    def delete(self, job_id: str) -> None:
        storage.delete(self.fs, [self.record_path(job_id), self._active(job_id)])

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

    # --- uploads -------------------------------------------------------------------------

    def create_upload(self, upload: Upload) -> bool:
        return self.create_file(self._upload_record(upload.id), _dump(asdict(upload)))

    def load_upload(self, upload_id: str) -> Upload | None:
        if not valid_id(upload_id):
            return None
        try:
            data = json.loads(storage.read_bytes(self.fs, self._upload_record(upload_id)))
            return Upload(**data)
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            return None

    def touch_upload(self, upload: Upload) -> None:
        upload.update_time = int(time.time())
        storage.write_atomic(self.fs, self._upload_record(upload.id), _dump(asdict(upload)))

    def uploads(self) -> list[Upload]:
        found = []
        directory = self._path("uploads")
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(directory, detail=False)
        except FileNotFoundError:
            return []
        for path in sorted(entries):
            name = posixpath.basename(path.rstrip("/"))
            if name.endswith(".json") and not name.startswith("."):
                upload = self.load_upload(name.removesuffix(".json"))
                if upload is not None:
                    found.append(upload)
        return found

    def upload_size(self, upload_id: str) -> tuple[int, int]:
        """(images, bytes) in an upload; (0, 0) when there is none."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.upload_path(upload_id), detail=True)
        except FileNotFoundError:
            return 0, 0
        files = [i for p, i in found.items() if not posixpath.basename(p).startswith(".")]
        return len(files), sum(int(i.get("size") or 0) for i in files)

    def put_upload(self, upload_id: str, name: str, data: bytes) -> None:
        storage.write_atomic(self.fs, posixpath.join(self.upload_path(upload_id), name), data)

    def delete_upload(self, upload_id: str) -> None:
        self.remove_tree(self.upload_url(upload_id))
        storage.delete(self.fs, [self._upload_record(upload_id)])

    def _upload_record(self, upload_id: str) -> str:
        return self._path("uploads", f"{upload_id}.json")


def _dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=1, sort_keys=True).encode()
