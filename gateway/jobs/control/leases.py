"""Leases in the job store: which process runs a job (or sweeps expired ones), so every
replica sharing a store answers for every job while only one works on it.

A lease is one file, `<store>/leases/<name>.json` = `{"holder", "expires", "generation",
"nonce"}`, changed only by conditional write (gateway.jobs.control.cas): a take, renew or release
replaces the version this process read (or last wrote), so of two processes that read the
same version exactly one succeeds. Every write has a new random `nonce`, so a version never
comes back: a holder that stalled past its lease, while another process took the lease and
renewed it, cannot renew into what it last wrote (no ABA) and learns it lost the lease.
The holder renews every third of the lease's length; when it stops renewing (it died), the
lease expires and another replica takes it. Expiry compares the holder's clock with the
reader's: replicas are expected to keep their clocks in sync (NTP), well within the lease's
length. Before each commit of results, and before it ends a job, the holder checks that its
version is still the current one (`holds`): a fence against a holder that lost its lease.
"""

from __future__ import annotations

import json
import os
import posixpath
import socket
import time
import uuid
from dataclasses import dataclass

from gateway.jobs.control.cas import Files
from gateway.jobs.control.store import JobStore
from gateway.jobs.runner import storage


def replica_id() -> str:
    """This process among the replicas: host, process id and a random part."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Lease:
    name: str
    generation: int
    holder: str
    expires: float  # time.time() after which it is free; 0 once released
    version: str = ""  # of the lease's file when this was read or written

    def live(self, now: float | None = None) -> bool:
        return self.expires > (time.time() if now is None else now)


class Leases:
    def __init__(self, store: JobStore, holder: str, seconds: float) -> None:
        self._store = store
        self._files = Files(store.fs)
        self.holder = holder
        self.seconds = seconds

    def _path(self, name: str) -> str:
        return posixpath.join(self._store.location.path, "leases", f"{name}.json")

    def current(self, name: str) -> Lease | None:
        """The lease as it is now, or None when it was never taken (or was removed)."""
        found = self._files.read(self._path(name))
        if found is None:
            return None
        try:
            data = json.loads(found.data)
            return Lease(
                name,
                int(data["generation"]),
                str(data["holder"]),
                float(data["expires"]),
                found.version,
            )
        except (ValueError, KeyError, TypeError):
            return Lease(name, 0, "", 0.0, found.version)  # unreadable: free to take

    def held_elsewhere(self, name: str) -> bool:
        """Another process holds the lease right now."""
        lease = self.current(name)
        return lease is not None and lease.holder != self.holder and lease.live()

    def holds(self, lease: Lease) -> bool:
        """`lease` (as this process last wrote it) is still the current one and live: the
        fence a holder checks before it commits work done under it."""
        now = self.current(lease.name)
        return (
            now is not None
            and now.version == lease.version
            and now.holder == self.holder
            and now.live()
        )

    def acquire(self, name: str) -> Lease | None:
        """The lease for this process (taken, or renewed if it holds it already); None when
        another process holds it or took it first."""
        lease = self.current(name)
        if lease is not None and lease.holder != self.holder and lease.live():
            return None
        return self._write(name, lease, time.time() + self.seconds)

    def renew(self, lease: Lease) -> Lease | None:
        """The lease renewed; None when it was lost (another process changed it since)."""
        return self._write(lease.name, lease, time.time() + self.seconds)

    def release(self, lease: Lease) -> None:
        """Frees the lease at once (unless another process took it meanwhile)."""
        self._write(lease.name, lease, 0.0)

    def remove(self, name: str, lease: Lease | None = None) -> bool:
        """Forgets the lease (its job is gone): only if it is still at `lease`'s version,
        when given. False when it changed or was gone."""
        return self._files.delete(self._path(name), None if lease is None else lease.version)

    def names(self) -> list[str]:
        """Every lease in the store."""
        root = posixpath.join(self._store.location.path, "leases")
        found = set()
        for path in storage.listing(self._store.fs, root):
            if posixpath.dirname(path) != root:
                continue
            name = posixpath.basename(path)
            if name.endswith(".json") and not name.startswith("."):
                found.add(name.removesuffix(".json"))
        return sorted(found)

    def _write(self, name: str, after: Lease | None, expires: float) -> Lease | None:
        generation = 1 if after is None else after.generation + 1
        body = json.dumps(
            {
                "holder": self.holder,
                "expires": expires,
                "generation": generation,
                "nonce": uuid.uuid4().hex,
            }
        ).encode()
        path = self._path(name)
        if after is None:
            version = self._files.create(path, body)
        else:
            version = self._files.replace(path, body, after.version)
        if version is None:
            return None
        return Lease(name, generation, self.holder, expires, version)
