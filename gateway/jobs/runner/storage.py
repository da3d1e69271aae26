"""Files on local disk or object storage (fsspec): listing, reading, atomic writes.

Every write the batch runner makes is atomic: on a local disk a temporary name in the same
directory, fsync, then rename; on an object store one PUT (`pipe_file`), which S3 and GCS
apply whole or not at all (s3fs switches to a multipart upload above its block size, which
also appears only when completed). A reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec
from fsspec.implementations.local import LocalFileSystem

GLOB_CHARS = frozenset("*?[")


class StorageError(Exception):
    """A dataset or output location that cannot be used; the message says why."""


@dataclass(frozen=True)
class Location:
    """A filesystem and a path on it (no protocol), e.g. S3 and `bucket/prefix`."""

    fs: Any
    path: str

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def url(self, path: str | None = None) -> str:
        """The path as a URL a person can paste (local paths stay plain)."""
        path = self.path if path is None else path
        if self.local:
            return path
        return self.fs.unstrip_protocol(path)

    def child(self, relative: str) -> str:
        return posixpath.join(self.path, relative) if relative else self.path


def resolve(url: str) -> Location:
    """`url` as a Location: a local path, `file://`, `s3://`, `gs://`, `memory://`, ..."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise StorageError(f"cannot open {url!r}: {e}") from None
    if isinstance(fs, LocalFileSystem):
        path = os.path.abspath(path)
    return Location(fs, path.rstrip("/") or "/")


def relative(path: str, root: str) -> str:
    return posixpath.relpath(path, root) if root else path


def read_bytes(fs: Any, path: str) -> bytes:
    return fs.cat_file(path)


class TooLarge(Exception):
    """A file over the size a read allows; `size` when it was listed, else None."""

    def __init__(self, size: int | None) -> None:
        super().__init__(f"{size} bytes" if size is not None else "too large")
        self.size = size


def read_capped(fs: Any, path: str, limit: int, size: int | None = None) -> bytes:
    """The file's bytes, never more than `limit` of them read: its listed `size` checked
    first (the listing's, else the one opening the file tells), then at most `limit + 1`
    bytes read (TooLarge when it gets them: the file grew, or its size was not told)."""
    if size is not None and size > limit:
        raise TooLarge(size)
    with fs.open(path, "rb") as f:
        told = getattr(f, "size", None)
        if isinstance(told, int) and told > limit:
            raise TooLarge(told)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(None)
    return bytes(data)


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[BinaryIO]:
    """A local file that replaces `path` whole when the block ends (a temporary name in the
    same directory, fsync, rename, fsync of the directory), or is removed when it fails."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
    try:
        with open(temporary, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _fsync_dir(directory)


def write_atomic(fs: Any, path: str, data: bytes) -> None:
    """Writes `data` to `path` so that readers see the old state or all of it."""
    if isinstance(fs, LocalFileSystem):
        with _replacing(path) as out:
            out.write(data)
        return
    fs.pipe_file(path, data)


def write_atomic_parts(
    fs: Any, path: str, parts: list[str], *, skip_first_line: bool = False
) -> None:
    """Writes the concatenation of the files `parts` (each without its first line when
    `skip_first_line`) to `path`, atomically."""
    if isinstance(fs, LocalFileSystem):
        with _replacing(path) as out:
            for part in parts:
                with open(part, "rb") as f:
                    if skip_first_line:
                        f.readline()
                    while chunk := f.read(1 << 20):
                        out.write(chunk)
        return
    chunks = []
    for part in parts:
        data = fs.cat_file(part)
        chunks.append(data[data.index(b"\n") + 1 :] if skip_first_line else data)
    fs.pipe_file(path, b"".join(chunks))


def remove_temporaries(fs: Any, directory: str, names: set[str] | None = None) -> None:
    """Deletes temporaries a killed process left in `directory` (local disks only): all of
    them, or those for the files `names`."""
    if not isinstance(fs, LocalFileSystem) or not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if not name.startswith(".tmp-"):
            continue
        target = name.split("-", 2)[2] if name.count("-") >= 2 else ""
        if names is None or target in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exists(fs: Any, path: str) -> bool:
    fs.invalidate_cache(path)
    return bool(fs.exists(path))


def listing(fs: Any, path: str) -> list[str]:
    """Every file below `path`, sorted (empty when there is none)."""
    fs.invalidate_cache()  # another process (a restart, another shard) may have written
    try:
        found = fs.find(path)
    except FileNotFoundError:
        return []
    return sorted(found)


def sized_listing(fs: Any, path: str) -> list[tuple[str, int]]:
    """Every file below `path` with its size, sorted (empty when there is none)."""
    fs.invalidate_cache()
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return []
    return sorted((p, int(info.get("size") or 0)) for p, info in found.items())


def delete(fs: Any, paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)


def remove_empty_dir(fs: Any, directory: str) -> None:
    """Local disks keep empty directories; object stores have none."""
    if isinstance(fs, LocalFileSystem):
        with contextlib.suppress(OSError):
            os.rmdir(directory)
