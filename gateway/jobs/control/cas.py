"""Conditional writes in the job store: a file changes only if nobody changed it since it
was read (compare-and-swap on a version), so records, leases and tallies shared by every
replica stay linearizable.

- Local disks: every change of a file in a directory happens under that directory's lock
  file (`.lock`, `fcntl.flock`: processes on one host and threads of one process alike), as
  a temporary file renamed over the old one; the version is the SHA-256 of the bytes.
- S3 (s3fs): the version is the object's ETag; a change is a PUT with `If-Match` (replace),
  `If-None-Match: *` (create) or a DELETE with `If-Match`: S3 itself refuses a write over a
  version that is gone, whoever made it.
- Any other fsspec store (memory://, gs://): the same check under a lock of this process
  only, so conditional only among the threads of one gateway process. Run one replica on
  such a store (docs/jobs.md).

Every body the job store writes through here carries a generation or a random part, so two
different writes never have the same bytes, and an old version cannot come back (no ABA).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import posixpath
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from gateway.jobs.runner import storage

# S3's refusals of a conditional write: the version changed (412), another conditional write
# to the key is in progress (409), or the object is gone.
_CONFLICTS = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404"})


@dataclass(frozen=True)
class Versioned:
    data: bytes
    version: str


class Files:
    """Conditional files on `fs` (see the module's docstring for how each store does it)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self._local = isinstance(fs, LocalFileSystem)
        self._s3 = not self._local and "s3" in _protocols(fs)
        self._lock = threading.Lock()  # other stores: this process only

    # --- reads ---------------------------------------------------------------------------

    def read(self, path: str) -> Versioned | None:
        """The file and its version; None when there is none."""
        if self._s3:
            return self._s3_read(path)
        try:
            data = storage.read_bytes(self.fs, path)
        except FileNotFoundError:
            return None
        return Versioned(data, _digest(data))

    # --- conditional changes -------------------------------------------------------------

    def create(self, path: str, data: bytes) -> str | None:
        """Writes a new file; its version, or None when the file exists already."""
        if self._s3:
            return self._s3_put(path, data, IfNoneMatch="*")
        with self._locked(path):
            if self._exists(path):
                return None
            storage.write_atomic(self.fs, path, data)
        return _digest(data)

    def replace(self, path: str, data: bytes, version: str) -> str | None:
        """Replaces the file if it is still at `version`; the new version, or None when it
        changed or is gone meanwhile."""
        if self._s3:
            return self._s3_put(path, data, IfMatch=version)
        with self._locked(path):
            current = self.read(path)
            if current is None or current.version != version:
                return None
            storage.write_atomic(self.fs, path, data)
        return _digest(data)

    def delete(self, path: str, version: str | None = None) -> bool:
        """Deletes the file (only if it is still at `version`, when given); False when it
        changed or was gone."""
        if self._s3:
            return self._s3_delete(path, version)
        with self._locked(path):
            current = self.read(path)
            if current is None or (version is not None and current.version != version):
                return False
            storage.delete(self.fs, [path])
        return True

    # --- local disks and other stores ----------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        if not self._local:
            with self._lock:
                yield
            return
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _exists(self, path: str) -> bool:
        if self._local:
            return os.path.exists(path)
        return storage.exists(self.fs, path)

    # --- S3 ------------------------------------------------------------------------------

    def _s3_call(self, method: str, path: str, **kwargs: Any) -> Any:
        from fsspec.asyn import sync

        bucket, key, _ = self.fs.split_path(path)

        async def call() -> Any:
            client = await self.fs.get_s3(bucket)
            response = await getattr(client, method)(Bucket=bucket, Key=key, **kwargs)
            if method == "get_object":
                async with response["Body"] as body:
                    return Versioned(await body.read(), response["ETag"])
            return response

        return sync(self.fs.loop, call)

    def _s3_read(self, path: str) -> Versioned | None:
        try:
            return self._s3_call("get_object", path)
        except Exception as e:
            if _s3_code(e) in ("NoSuchKey", "404"):
                return None
            raise

    def _s3_put(self, path: str, data: bytes, **condition: str) -> str | None:
        try:
            response = self._s3_call("put_object", path, Body=data, **condition)
        except Exception as e:
            if _s3_code(e) in _CONFLICTS:
                return None
            raise
        self.fs.invalidate_cache(posixpath.dirname(path))
        return str(response["ETag"])

    def _s3_delete(self, path: str, version: str | None) -> bool:
        if self._s3_read(path) is None:
            return False
        condition = {} if version is None else {"IfMatch": version}
        try:
            self._s3_call("delete_object", path, **condition)
        except Exception as e:
            if _s3_code(e) in _CONFLICTS:
                return False
            raise
        self.fs.invalidate_cache(posixpath.dirname(path))
        return True


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _s3_code(error: Exception) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code is None:
            code = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return str(code)
    if isinstance(error, FileNotFoundError) or getattr(error, "errno", None) == errno.ENOENT:
        return "NoSuchKey"
    return ""
