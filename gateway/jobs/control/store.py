"""The job store: job records and uploads under one fsspec URI (`--job-store`), shared by
every replica.

Layout:

    <store>/operations/<id>.json       one job record (JSON)
    <store>/active/<id>                an unfinished job (what replicas look for work in)
    <store>/callers/<key>.json         a caller's operations (gateway.jobs.control.index)
    <store>/usage.json                 the tally of bytes and open uploads (control.tally)
    <store>/leases/<name>.json         who runs a job (or sweeps expired ones): see leases.py
    <store>/uploads/<upload id>.json   an upload's owner, times, images and bytes
    <store>/uploads/<upload id>/<name> its images
    <store>/jobs/<id>/output/          a job's results when the caller named no output

Nothing is written until the first job or upload (a gateway without jobs writes no files).
Records and upload records change only by conditional write (gateway.jobs.control.cas): created if
absent (two replicas given the same request_id make one job), replaced only over the version
read, so concurrent changes (a cancel racing the job's end) are never lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from gateway.errors import GatewayError, Kind
from gateway.jobs.control.cas import Files
from gateway.jobs.control.index import CallerIndex
from gateway.jobs.control.tally import RECORD_BYTES, Budget, Tally
from gateway.jobs.runner import storage
from gateway.jobs.spec.records import Job, valid_id

DEFAULT_MAX_BYTES = 4096 << 20
ORPHAN_SECONDS = 120.0


@dataclass
class Upload:
    id: str
    owner: str
    create_time: int
    update_time: int  # the last upload call
    images: int = 0
    bytes: int = 0  # charged to the tally: given back when the upload goes
    used: bool = False  # a job uses it (it no longer counts as open)
    generation: int = 0


class JobStore:
    def __init__(self, url: str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.location = storage.resolve(url)
        self.fs = self.location.fs
        self.files = Files(self.fs)
        self.tally = Tally(self.files, self.location.path, max_bytes)
        self.index = CallerIndex(self.files, self._path("callers"))

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

    def remove_tree(self, url: str) -> None:
        location = storage.resolve(url)
        storage.delete(location.fs, storage.listing(location.fs, location.path))
        if isinstance(location.fs, LocalFileSystem):
            for root, _dirs, _files in sorted(os.walk(location.path), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(root)

    def remove_area(self, job_id: str) -> None:
        """Removes a job's own area in the store (its default output) and its folder."""
        self.remove_tree(self.area_url(job_id))
        storage.remove_empty_dir(self.fs, self._path("jobs", job_id))

    # --- records -------------------------------------------------------------------------

    def create(self, job: Job, max_jobs: int = 0) -> bool:
        """Writes a new record, its bytes (and room for its growth, index entry and lease)
        reserved in the tally and counted in `charged`, with its slot among the `max_jobs`
        unfinished jobs (0: no limit) in the same write; False when one with this id exists
        already. GatewayError OVERLOADED when the store is full or every slot taken."""
        cost = len(job.to_json()) + RECORD_BYTES
        self.tally.reserve(cost, jobs_limit=max_jobs)
        job.charged = cost
        if self.files.create(self.record_path(job.id), job.to_json()) is None:
            self.tally.release(cost, jobs=1 if max_jobs else 0)
            job.charged = 0
            return False
        storage.write_atomic(self.fs, self._active(job.id), b"")
        return True

    def update(self, job_id: str, change: Callable[[Job], bool]) -> Job | None:
        """Applies `change` to the current record by conditional write, read again and
        retried when another process changed it first. `change` returns False to leave the
        record as it is. The record as it now is; None when there is none (or it is being
        deleted)."""
        for attempt in range(1000):
            found = self.files.read(self.record_path(job_id))
            job = None if found is None else _parse(found.data)
            if found is None or job is None or job.deleted:
                return None
            was_done = job.done
            if not change(job):
                return job
            job.generation += 1
            job.update_time = time.time()
            if self.files.replace(self.record_path(job_id), job.to_json(), found.version):
                if job.done and not was_done:  # this write ended it: its slot goes back
                    storage.delete(self.fs, [self._active(job.id)])
                    self.index.set_state(job.caller, job.id, job.state)
                    self.tally.release(0, jobs=1)
                return job
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** min(attempt, 6))))
        raise GatewayError(Kind.UNAVAILABLE, f"the record of operations/{job_id} is too busy")

    def save(self, job: Job) -> Job | None:
        """Merges an executor's change of `job` into the current record (see `merge`)."""
        return self.update(job.id, lambda current: merge(current, job))

    def budget(self, job_id: str) -> Budget:
        """How the batch runner charges the result bytes job `job_id` writes into the store
        (gateway.jobs.control.tally.Budget): `charge(n)` before writing n bytes, `close()` at the
        end."""

        def record(size: int) -> bool:
            def add(job: Job) -> bool:
                job.charged = max(0, job.charged + size)
                return True

            return self.update(job_id, add) is not None

        return Budget(self.tally, record)

    def mark_active(self, job_ids: list[str]) -> None:
        """Adds unfinished jobs to the index (those that are there already stay)."""
        have = set(self.active())
        for job_id in job_ids:
            if job_id not in have:
                storage.write_atomic(self.fs, self._active(job_id), b"")
                self.live(job_id)  # it may have ended since it was read

    def active(self) -> list[str]:
        """The ids of unfinished jobs (a job that ended or was deleted meanwhile may be among
        them: load its record)."""
        names = [posixpath.basename(p) for p in storage.listing(self.fs, self._path("active"))]
        return [n for n in names if valid_id(n)]

    def live(self, job_id: str) -> Job | None:
        """The unfinished job an active marker names; None when it ended, is being deleted or
        is gone, and the marker goes when it ended or is gone (a replica that marked a job
        while another ended it leaves one, which would count against GATEWAY_BATCH_MAX_JOBS)."""
        job = self.load(job_id, deleted=True)
        if job is None or job.done:
            storage.delete(self.fs, [self._active(job_id)])
            return None
        return None if job.deleted else job

    def _active(self, job_id: str) -> str:
        return self._path("active", job_id)

    def load(self, job_id: str, deleted: bool = False) -> Job | None:
        """The record; None when there is none, or it is being deleted (unless `deleted`)."""
        if not valid_id(job_id):
            return None
        found = self.files.read(self.record_path(job_id))
        job = None if found is None else _parse(found.data)
        if job is None or (job.deleted and not deleted):
            return None
        return job

    def forget(self, job: Job) -> bool:
        """Removes the record (the last step of a delete: its files went first) and gives
        back what it held; False when another process removed it first."""
        found = self.files.read(self.record_path(job.id))
        if found is None or not self.files.delete(self.record_path(job.id), found.version):
            return False
        storage.delete(self.fs, [self._active(job.id)])
        current = _parse(found.data)
        charged = current.charged if current is not None else job.charged
        unfinished = not (current if current is not None else job).done
        if charged > 0 or unfinished:  # an unfinished job's slot goes back with its record
            self.tally.release(charged, jobs=1 if unfinished else 0)
        self.index.drop(job.caller, job.id)
        return True

    def jobs(self, deleted: bool = False) -> list[Job]:
        """Every record (those being deleted too, when `deleted`), oldest first: a scan of
        the store for startup and the expiry sweep, never on a caller's request."""
        found = []
        for path in storage.listing(self.fs, self._path("operations")):
            name = posixpath.basename(path)
            if name.startswith(".") or not name.endswith(".json"):
                continue
            with contextlib.suppress(FileNotFoundError):
                job = _parse(storage.read_bytes(self.fs, path))
                if job is not None and (deleted or not job.deleted):
                    found.append(job)
        found.sort(key=lambda j: (j.create_time, j.id))
        return found

    def entries(self, caller: str) -> dict[str, list[Any]]:
        """The caller's index, its unfinished entries checked against their records (a
        process killed between a record's write and the index's leaves one behind; one whose
        record never came, ORPHAN_SECONDS after its creation, was a create that failed)."""
        entries = self.index.entries(caller)
        for job_id, (created, state) in list(entries.items()):
            if state:
                continue
            job = self.load(job_id, deleted=True)
            if job is None and time.time() - float(created) > ORPHAN_SECONDS:
                self.index.drop(caller, job_id)
                del entries[job_id]
            elif job is not None and job.done:
                self.index.set_state(caller, job_id, job.state)
                entries[job_id] = [created, job.state]
        return entries

    def upgrade(self, jobs: list[Job]) -> None:
        """For a store written by an earlier version: every record in its caller's index,
        and a tally measured once (the bytes in the store) when there is none yet."""
        by_caller: dict[str, list[Job]] = {}
        for job in jobs:
            by_caller.setdefault(job.caller, []).append(job)
        for caller, found in by_caller.items():

            def add(entries: dict[str, list[Any]], found: list[Job] = found) -> bool:
                missing = [j for j in found if j.id not in entries]
                for job in missing:
                    entries[job.id] = [job.create_time, job.state if job.done else ""]
                return bool(missing)

            self.index.change(caller, add)
        # Only a store holding jobs or uploads: a new one's files (the expiry lease) are
        # within OVERHEAD.
        if (jobs or self.uploads()) and self.files.read(self._path("usage.json")) is None:
            self.fs.invalidate_cache()
            with contextlib.suppress(FileNotFoundError):
                measured = int(self.fs.du(self.location.path, total=True))
                if measured > 0:
                    self.tally.change(lambda d: d.update(bytes=max(d["bytes"], measured)))
        if "jobs" not in self.tally.read():  # a tally from before it counted jobs
            unfinished = sum(1 for job in jobs if not job.done)
            self.tally.change(lambda d: d.setdefault("jobs", unfinished))

    # --- uploads -------------------------------------------------------------------------

    def create_upload(self, upload: Upload) -> bool:
        return self.files.create(self._upload_record(upload.id), _dump(asdict(upload))) is not None

    def load_upload(self, upload_id: str) -> Upload | None:
        if not valid_id(upload_id):
            return None
        found = self.files.read(self._upload_record(upload_id))
        return None if found is None else _upload(found.data)

    def update_upload(self, upload_id: str, change: Callable[[Upload], bool]) -> Upload | None:
        """As `update`, for an upload's record."""
        path = self._upload_record(upload_id)
        for attempt in range(1000):
            found = self.files.read(path)
            upload = None if found is None else _upload(found.data)
            if found is None or upload is None:
                return None
            if not change(upload):
                return upload
            upload.generation += 1
            upload.update_time = int(time.time())
            if self.files.replace(path, _dump(asdict(upload)), found.version):
                return upload
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** min(attempt, 6))))
        raise GatewayError(Kind.UNAVAILABLE, f"the record of upload {upload_id} is too busy")

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

    def put_upload(self, upload_id: str, name: str, data: bytes) -> None:
        storage.write_atomic(self.fs, posixpath.join(self.upload_path(upload_id), name), data)

    def delete_upload(self, upload: Upload) -> None:
        """Removes the upload's images, then its record, and gives back what it held (once:
        only the process whose conditional delete of the record succeeds)."""
        self.remove_tree(self.upload_url(upload.id))
        path = self._upload_record(upload.id)
        found = self.files.read(path)
        if found is None or not self.files.delete(path, found.version):
            return
        current = _upload(found.data) or upload
        self.tally.release(current.bytes, current.owner, 0 if current.used else 1, RECORD_BYTES)

    def _upload_record(self, upload_id: str) -> str:
        return self._path("uploads", f"{upload_id}.json")


def merge(current: Job, change: Job) -> bool:
    """What an executor's write of `change` makes of the `current` record: a job that ended
    stays as it ended, and a cancel asked for meanwhile is kept (CANCELLING until the job
    ends); the bytes charged are the store's own count. False: nothing to write."""
    if current.done:
        return False
    cancel = current.cancel_requested or change.cancel_requested
    charged = current.charged
    for name, value in vars(change).items():
        if name not in ("generation", "deleted", "charged", "create_time", "caller", "id"):
            setattr(current, name, value)
    current.cancel_requested = cancel
    current.charged = charged
    if cancel and not current.done:
        current.state = "CANCELLING"
    return True


def _parse(raw: bytes) -> Job | None:
    try:
        return Job.from_json(raw)
    except (ValueError, TypeError):  # not a record this version can read
        return None


def _upload(raw: bytes) -> Upload | None:
    try:
        return Upload(**json.loads(raw))
    except (ValueError, TypeError):
        return None


def _dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=1, sort_keys=True).encode()
