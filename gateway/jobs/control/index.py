"""Each caller's operations, one small file per caller (`<store>/callers/<key>.json`), so a
listing reads its caller's index and only the records it returns, never every record, and the
per-caller limits (unfinished jobs, finished operations kept) are checked and taken in one
conditional write (gateway.jobs.control.cas), across replicas.

An entry is `id: [create_time, state]`, the state empty while the job is unfinished and its
final state once it ended (a final state never changes, so a filter on it needs no record).
The record stays the truth: an entry left unfinished by a process killed between the
record's write and the index's is corrected the next time the caller's index is read.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import random
import time
from collections.abc import Callable
from typing import Any

from gateway import identity
from gateway.errors import GatewayError, Kind
from gateway.jobs.control.cas import Files

Entries = dict[str, list[Any]]  # id -> [create_time, state or ""]


class CallerIndex:
    def __init__(self, files: Files, root: str) -> None:
        self._files = files
        self._root = root

    def _path(self, caller: str) -> str:
        key = hashlib.sha256(caller.encode()).hexdigest()[:32]
        return posixpath.join(self._root, f"{key}.json")

    def entries(self, caller: str) -> Entries:
        found = self._files.read(self._path(caller))
        return {} if found is None else _parse(found.data)[1]

    def callers(self) -> list[str]:
        """Every caller with an index (for the admins' listings)."""
        try:
            names = self._files.fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for path in names:
            name = posixpath.basename(path)
            if not name.endswith(".json") or name.startswith("."):
                continue
            read = self._files.read(path)
            if read is not None:
                found.append(_parse(read.data)[0])
        return sorted(c for c in found if c)

    def change(self, caller: str, change: Callable[[Entries], bool]) -> Entries:
        """Applies `change` (False: nothing to write; GatewayError: refused) by conditional
        write, retried on conflict."""
        path = self._path(caller)
        for attempt in range(1000):
            found = self._files.read(path)
            _, entries, generation = ("", {}, 0) if found is None else _parse(found.data)
            if not change(entries):
                return entries
            body = json.dumps(
                {"caller": caller, "generation": generation + 1, "jobs": entries}, sort_keys=True
            ).encode()
            if found is None:
                written = self._files.create(path, body)
            else:
                written = self._files.replace(path, body, found.version)
            if written is not None:
                return entries
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** min(attempt, 6))))
        raise GatewayError(Kind.UNAVAILABLE, f"the operations index of {caller} is too busy")

    def set_state(self, caller: str, job_id: str, state: str) -> None:
        def change(entries: Entries) -> bool:
            if job_id not in entries or entries[job_id][1] == state:
                return False
            entries[job_id][1] = state
            return True

        self.change(caller, change)

    def drop(self, caller: str, job_id: str) -> None:
        self.change(caller, lambda entries: entries.pop(job_id, None) is not None)


def admit(job: Any, live_limit: int, finished_limit: int) -> Callable[[Entries], bool]:
    """The change that adds `job` (a gateway.jobs.spec.records.Job) to its caller's index, within
    the caller's limits on unfinished jobs and finished operations kept (checked and taken in
    the same conditional write)."""

    def add(entries: Entries) -> bool:
        if job.id in entries:
            return False  # the same request_id again
        live = sum(not state for _, state in entries.values())
        if live >= live_limit:
            raise GatewayError(
                Kind.OVERLOADED,
                f"caller {identity.shown(job.caller)} has its limit of {live_limit} unfinished "
                "batch jobs; wait for some to finish or cancel them "
                "(GATEWAY_BATCH_MAX_JOBS_PER_CALLER)",
            )
        if len(entries) - live >= finished_limit:
            raise GatewayError(
                Kind.OVERLOADED,
                f"caller {identity.shown(job.caller)} keeps {len(entries) - live} finished "
                "operations, its limit (GATEWAY_BATCH_MAX_FINISHED_PER_CALLER); delete those "
                "whose results you have (DeleteOperation), or wait for them to expire "
                "(GATEWAY_OPERATION_TTL)",
            )
        entries[job.id] = [job.create_time, ""]
        return True

    return add


def _parse(raw: bytes) -> tuple[str, Entries, int]:
    try:
        data = json.loads(raw)
        return str(data["caller"]), dict(data["jobs"]), int(data["generation"])
    except (ValueError, KeyError, TypeError):
        raise GatewayError(
            Kind.INTERNAL, "a caller's index in the job store is not one this gateway wrote"
        ) from None
