"""Where a batch job started through the API may read: allowed prefixes, checked before
anything is opened.

A location is normalised first (`//`, `.` and `..` collapsed; on a local disk every symlink
resolved, so a link that leaves a prefix is outside it) and then must equal a prefix or lie
below it, on the same filesystem (`s3://` is not `gs://`; a path without a scheme is a local
path). Chained URLs (`a::b`) are refused. The answer never depends on whether the location
exists, so a refusal tells a caller nothing about what is there.

`detection-batch` run from the command line has no Guard: an operator reads what the
process can read.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from gateway.batch import storage
from gateway.errors import GatewayError, Kind

INPUT_REFUSAL = (
    "is outside the locations this gateway lets batch jobs read; upload the images with "
    "UploadImages, or ask for its prefix to be added to GATEWAY_BATCH_ALLOWED_INPUT_URIS"
)
_LOCAL = frozenset({"", "file", "local"})
_ALIASES = {"s3a": "s3", "gcs": "gs"}


@dataclass(frozen=True)
class Place:
    """A normalised location: a filesystem name and an absolute path on it."""

    scheme: str  # "file" for local paths
    path: str

    def holds(self, other: Place) -> bool:
        if self.scheme != other.scheme:
            return False
        root = self.path.rstrip("/")
        return other.path == root or other.path.startswith(root + "/") or root == ""


def place(url: str) -> Place | None:
    """`url` normalised, or None when it cannot be a place a job reads (a chained URL, a
    relative URL of a remote filesystem)."""
    text = url.strip()
    if not text or "::" in text:
        return None
    protocol, path = fsspec.core.split_protocol(text)
    scheme = (protocol or "").lower()
    if scheme in _LOCAL:
        return Place("file", os.path.realpath(os.path.abspath(path)))
    path = re.sub(r"/+", "/", path)
    normal = posixpath.normpath("/" + path)
    return Place(_ALIASES.get(scheme, scheme), normal)


def local_place(path: str) -> Place:
    return Place("file", os.path.realpath(path))


def fs_place(fs: Any, path: str) -> Place:
    """A path on a filesystem fsspec opened, normalised as `place` does."""
    if isinstance(fs, LocalFileSystem):
        return local_place(path)
    protocol = str(fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol)
    scheme = _ALIASES.get(protocol, protocol)
    return Place(scheme, posixpath.normpath("/" + re.sub(r"/+", "/", path)))


class Guard:
    """The places a job may read; `refusal` is the message every refusal carries."""

    def __init__(self, places: Iterable[Place], refusal: str = INPUT_REFUSAL) -> None:
        self.places = tuple(places)
        self.refusal = refusal

    @classmethod
    def of(cls, prefixes: Iterable[str], refusal: str = INPUT_REFUSAL) -> Guard:
        found = [place(p) for p in prefixes]
        return cls([p for p in found if p is not None], refusal)

    def urls(self) -> list[str]:
        """The places as prefixes `Guard.of` reads back."""
        return [
            p.path if p.scheme == "file" else f"{p.scheme}://{p.path.lstrip('/')}"
            for p in self.places
        ]

    def with_places(self, extra: Iterable[Place]) -> Guard:
        return Guard((*self.places, *extra), self.refusal)

    def allows(self, where: Place | None) -> bool:
        return where is not None and any(p.holds(where) for p in self.places)

    def denied(self, what: str) -> GatewayError:
        return GatewayError(Kind.PERMISSION_DENIED, f"{what} {self.refusal}")

    def check_url(self, url: str, what: str) -> None:
        if not self.allows(place(url)):
            raise self.denied(f"{what} {url}")

    def check_file(self, fs: Any, path: str, what: str) -> None:
        """A file found on `fs`: refused when it (or a symlink on the way) leads outside."""
        if not self.allows(fs_place(fs, path)):
            raise self.denied(f"{what} {storage.Location(fs, path).url()}")

    def loader(self, fs: Any, path: str, what: str) -> Callable[[], bytes]:
        """Reads the file, checking again just before (a symlink may have changed)."""

        def load() -> bytes:
            self.check_file(fs, path, what)
            return storage.read_bytes(fs, path)

        return load
