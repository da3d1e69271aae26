"""What the job store holds, as a tally kept beside it (`<store>/usage.json`), so the store's
bound and the per-caller upload quotas are reservations, not scans of the store.

The tally is `{"generation", "bytes", "jobs", "callers": {caller: {"bytes", "open"}}}`: the
bytes of uploaded images and of results written into the store, the unfinished jobs
(GATEWAY_BATCH_MAX_JOBS: a create takes a slot with its record's bytes, the write that ends
the job or removes its record gives it back), and per caller the bytes of their uploads and
how many of their uploads no job uses yet. Every change is one conditional write
(gateway.jobs.control.cas) that checks the limits and adds in the same step, so concurrent calls in
one process, and replicas sharing the store, can never reserve past a limit together: of two
callers racing for the last byte one gets it, the other RESOURCE_EXHAUSTED. Bytes are
reserved before they are written and given back when what holds them is deleted; a process
killed between the two leaves its reservation counted (the tally errs on the side of the
bound, never past it).

`Budget` is how the batch runner charges the result bytes it writes into the store.
"""

from __future__ import annotations

import json
import posixpath
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from gateway import identity
from gateway.errors import GatewayError, Kind
from gateway.jobs.control.cas import Files

Change = Callable[[dict[str, Any]], None]

# Of the store's bound, kept for the files of the store itself (this tally, the callers'
# indexes, leases: each a few hundred bytes, a tally entry per caller with uploads).
OVERHEAD = 64 << 10
# Reserved with each upload and each job for its own records (an upload's record; a job's
# record, index entry and lease), whatever the bytes of its images or results.
RECORD_BYTES = 4 << 10


def store_full(used: int, limit: int, wanted: int = 0) -> GatewayError:
    more = f" and {wanted} more were asked for" if wanted else ""
    return GatewayError(
        Kind.OVERLOADED,
        f"the job store holds {used} of its {limit} bytes{more} "
        "(GATEWAY_JOB_STORE_MAX_BYTES, less 64 KiB for the store's own files); delete "
        "finished operations you no longer need (their results in the store go with them) "
        "or wait for them to expire (GATEWAY_OPERATION_TTL)",
    )


def jobs_full(limit: int) -> GatewayError:
    return GatewayError(
        Kind.OVERLOADED,
        f"the gateway has its limit of {limit} unfinished batch jobs (all replicas sharing "
        "its job store); wait for some to finish or cancel them (GATEWAY_BATCH_MAX_JOBS)",
    )


class Tally:
    def __init__(self, files: Files, root: str, limit: int) -> None:
        self._files = files
        self._path = posixpath.join(root, "usage.json")
        # What GATEWAY_JOB_STORE_MAX_BYTES leaves for uploads, results and their records.
        self.limit = max(0, limit - OVERHEAD)

    def read(self) -> dict[str, Any]:
        found = self._files.read(self._path)
        return _empty() if found is None else _parse(found.data)

    def used(self) -> int:
        return int(self.read()["bytes"])

    def room(self) -> int:
        """Bytes the store may still take."""
        return max(0, self.limit - self.used())

    def change(self, change: Change) -> dict[str, Any]:
        """Applies `change` (which raises GatewayError to refuse) by conditional write,
        retried on conflict; returns the tally as written."""
        for attempt in range(1000):
            found = self._files.read(self._path)
            data = _empty() if found is None else _parse(found.data)
            change(data)
            data["bytes"] = max(0, int(data["bytes"]))
            data["generation"] = int(data["generation"]) + 1
            body = json.dumps(data, sort_keys=True).encode()
            if found is None:
                written = self._files.create(self._path, body)
            else:
                written = self._files.replace(self._path, body, found.version)
            if written is not None:
                return data
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** min(attempt, 6))))
        raise GatewayError(Kind.UNAVAILABLE, "the job store's tally is too busy; retry")

    # --- the operations ------------------------------------------------------------------

    def reserve(
        self, size: int, caller: str = "", caller_limit: int = 0, jobs_limit: int = 0
    ) -> None:
        """Reserves `size` bytes in the store (and of `caller`'s upload share when given;
        and one unfinished job's slot, with `jobs_limit`); GatewayError OVERLOADED when a
        limit would be passed."""

        def change(data: dict[str, Any]) -> None:
            used = int(data["bytes"])
            if used + size > self.limit:
                raise store_full(used, self.limit, size)
            if jobs_limit:
                if int(data.get("jobs", 0)) >= jobs_limit:
                    raise jobs_full(jobs_limit)
                data["jobs"] = int(data.get("jobs", 0)) + 1
            if caller:
                mine = _caller(data, caller)
                if mine["bytes"] + size > caller_limit:
                    raise caller_full(caller, mine["bytes"], caller_limit)
                mine["bytes"] += size
            data["bytes"] = used + size

        self.change(change)

    def release(
        self, size: int, caller: str = "", opened: int = 0, records: int = 0, jobs: int = 0
    ) -> None:
        """Gives back `size` bytes (of `caller`'s share too), `opened` open uploads,
        `records` bytes of the store only (an upload's record) and `jobs` job slots."""

        def change(data: dict[str, Any]) -> None:
            data["bytes"] = int(data["bytes"]) - size - records
            if jobs:
                data["jobs"] = max(0, int(data.get("jobs", 0)) - jobs)
            if caller:
                mine = _caller(data, caller)
                mine["bytes"] = max(0, mine["bytes"] - size)
                mine["open"] = max(0, mine["open"] - opened)
                if mine == {"bytes": 0, "open": 0}:
                    del data["callers"][caller]

        self.change(change)

    def open_upload(self, caller: str, most: int) -> None:
        """Counts a new upload of `caller` that no job uses yet, and reserves its record;
        OVERLOADED at `most`, or when the store is full."""

        def change(data: dict[str, Any]) -> None:
            used = int(data["bytes"])
            if used + RECORD_BYTES > self.limit:
                raise store_full(used, self.limit, RECORD_BYTES)
            mine = _caller(data, caller)
            if mine["open"] >= most:
                raise GatewayError(
                    Kind.OVERLOADED,
                    f"caller {identity.shown(caller)} has {mine['open']} uploads no job uses "
                    "yet, its limit (GATEWAY_BATCH_MAX_UPLOADS_PER_CALLER); create jobs over "
                    "them or add to one (pass its upload_id), or wait for unused ones to expire "
                    "(GATEWAY_UPLOAD_TTL)",
                )
            mine["open"] += 1
            data["bytes"] = used + RECORD_BYTES

        self.change(change)


def caller_full(caller: str, kept: int, limit: int) -> GatewayError:
    return GatewayError(
        Kind.OVERLOADED,
        f"caller {identity.shown(caller)} keeps {kept} bytes of uploads, and its limit is {limit} "
        "(GATEWAY_BATCH_MAX_UPLOAD_BYTES_PER_CALLER); delete the operations over uploads you "
        "no longer need, or wait for unused uploads to expire (GATEWAY_UPLOAD_TTL)",
    )


class Budget:
    """The bytes one job writes into the store, charged as they are written: `charge(n)`
    before writing n bytes raises GatewayError OVERLOADED (RESOURCE_EXHAUSTED, naming
    GATEWAY_JOB_STORE_MAX_BYTES) when the store cannot take them; nothing was reserved then.
    Thread-safe. Reserves ahead in steps of `step` bytes (a tally write per step, not per
    line), recording each step in the job's record (`Job.charged`) first so that deleting the
    job gives back exactly what it took; `close()` gives back what was reserved ahead and not
    used."""

    def __init__(self, tally: Tally, record: Callable[[int], bool], step: int = 1 << 20) -> None:
        self._tally = tally
        self._record = record  # adds n to the job's `charged`; False when the job is gone
        self._step = max(1, step)
        self._left = 0
        self._lock = threading.Lock()

    def charge(self, size: int) -> None:
        with self._lock:
            if size <= self._left:
                self._left -= size
                return
            wanted = size - self._left
            ahead = max(wanted, min(self._step, self._tally.limit // 64))
            try:
                self._tally.reserve(ahead)
            except GatewayError:
                if ahead == wanted:
                    raise
                self._tally.reserve(wanted)  # the last bytes the store has room for
                ahead = wanted
            if not self._record(ahead):
                self._tally.release(ahead)
                raise GatewayError(Kind.CANCELLED, "the operation was deleted")
            self._left += ahead - size

    def close(self) -> None:
        with self._lock:
            left, self._left = self._left, 0
            if left and self._record(-left):
                self._tally.release(left)


def _empty() -> dict[str, Any]:
    return {"generation": 0, "bytes": 0, "jobs": 0, "callers": {}}


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("callers"), dict):
            return data
    except ValueError:
        pass
    raise GatewayError(
        Kind.INTERNAL, "the job store's usage.json is not a tally this gateway wrote"
    )


def _caller(data: dict[str, Any], caller: str) -> dict[str, int]:
    entry: dict[str, int] = data["callers"].setdefault(caller, {"bytes": 0, "open": 0})
    return entry
