"""Leases in the job store: which process runs a job (or sweeps expired ones), so every
replica sharing a store answers for every job while only one works on it.

A lease is a series of generations, `<store>/leases/<name>/<generation>.json`, each
`{"holder", "expires"}`. Every change (take, renew, release) writes the next generation with
create-if-absent (a hard link on a local disk, a conditional PUT on S3 and GCS), so of two
processes that read generation N and write N + 1 exactly one succeeds: a compare-and-swap
on the generation number. The holder renews every third of the lease's length; when it
stops renewing (it died), the lease expires and another replica takes it. Old generations
are deleted as new ones are written. Expiry compares the holder's clock with the reader's:
replicas are expected to keep their clocks in sync (NTP), well within the lease's length.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import socket
import time
import uuid
from dataclasses import dataclass

from gateway.batch import storage
from gateway.jobs.store import JobStore

_GENERATION = re.compile(r"^(\d{12})\.json$")


def replica_id() -> str:
    """This process among the replicas: host, process id and a random part."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Lease:
    name: str
    generation: int
    holder: str
    expires: float  # time.time() after which it is free; 0 once released

    def live(self, now: float | None = None) -> bool:
        return self.expires > (time.time() if now is None else now)


class Leases:
    def __init__(self, store: JobStore, holder: str, seconds: float) -> None:
        self._store = store
        self._fs = store.fs
        self.holder = holder
        self.seconds = seconds

    def _dir(self, name: str) -> str:
        return posixpath.join(self._store.location.path, "leases", name)

    def _generations(self, name: str) -> list[tuple[int, str]]:
        found = []
        for path in storage.listing(self._fs, self._dir(name)):
            match = _GENERATION.match(posixpath.basename(path))
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def current(self, name: str) -> Lease | None:
        """The latest generation, or None when the lease was never taken."""
        for generation, path in reversed(self._generations(name)):
            try:
                data = json.loads(storage.read_bytes(self._fs, path))
                return Lease(name, generation, str(data["holder"]), float(data["expires"]))
            except FileNotFoundError:
                continue  # deleted as a newer one was written: look again
            except (ValueError, KeyError, TypeError):
                return Lease(name, generation, "", 0.0)  # unreadable: free, but counted
        return None

    def held_elsewhere(self, name: str) -> bool:
        """Another process holds the lease right now."""
        lease = self.current(name)
        return lease is not None and lease.holder != self.holder and lease.live()

    def acquire(self, name: str) -> Lease | None:
        """The lease for this process (taken, or renewed if it holds it already); None when
        another process holds it or took it first."""
        lease = self.current(name)
        if lease is not None and lease.holder != self.holder and lease.live():
            return None
        after = 0 if lease is None else lease.generation
        return self._write(name, after, time.time() + self.seconds)

    def renew(self, lease: Lease) -> Lease | None:
        """The lease renewed; None when it was lost (another process took it)."""
        return self._write(lease.name, lease.generation, time.time() + self.seconds)

    def release(self, lease: Lease) -> None:
        """Frees the lease at once (unless another process took it meanwhile)."""
        self._write(lease.name, lease.generation, 0.0)

    def remove(self, name: str) -> None:
        """Forgets the lease (its job is gone)."""
        storage.delete(self._fs, [path for _, path in self._generations(name)])
        storage.remove_empty_dir(self._fs, self._dir(name))

    def names(self) -> list[str]:
        """Every lease in the store."""
        root = posixpath.join(self._store.location.path, "leases")
        paths = storage.listing(self._fs, root)
        return sorted({posixpath.basename(posixpath.dirname(p)) for p in paths})

    def _write(self, name: str, after: int, expires: float) -> Lease | None:
        generation = after + 1
        body = json.dumps({"holder": self.holder, "expires": expires}).encode()
        path = posixpath.join(self._dir(name), f"{generation:012d}.json")
        if not self._store.create_file(path, body):
            return None
        old = [p for g, p in self._generations(name) if g < generation - 1]
        storage.delete(self._fs, old)
        return Lease(name, generation, self.holder, expires)
