"""Where a batch job started through the API may read and write: allowed prefixes, and
fences no job crosses (the job store), checked on the parsed location before anything is
opened or fetched.

A location is parsed first. A local path is normalised (`//`, `.` and `..` collapsed, every
symlink resolved, so a link that leaves a prefix is outside it). A URL with a scheme is
taken apart, never normalised: its scheme and host must equal the prefix's exactly, and a
URL with a fragment (`#`), a query (`?`), user information (`user@`), a backslash, a
percent-escape (`%2e`, `%2f`, ...) or a `.`/`..` segment is no place at all, so what a
server would fetch and what is compared cannot differ. Chained URLs (`a::b`) and control
characters are refused too. Then the location must equal a prefix or lie below it, on the
same filesystem (`s3://` is not `gs://`; a path without a scheme is a local path).

Fences: nothing inside a fence, nor anything holding one (an ancestor, or a glob whose
fixed part is one), is allowed, whatever the prefixes say; except below a prefix that lies
inside the fence itself (the job's own upload, in the store). The answer never depends on
whether the location exists, so a refusal tells a caller nothing about what is there.

`detection-batch` run from the command line has no Guard: an operator reads what the
process can read.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from gateway.errors import GatewayError, Kind
from gateway.jobs.runner import storage

INPUT_REFUSAL = (
    "is outside the locations this gateway lets batch jobs read; upload the images with "
    "UploadImages, or ask for its prefix to be added to GATEWAY_BATCH_ALLOWED_INPUT_URIS"
)
_LOCAL = frozenset({"", "file", "local"})
_ALIASES = {"s3a": "s3", "gcs": "gs"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What a server may decode or read differently from how it is compared here.
_AMBIGUOUS = re.compile(r"[#?\\%@]")
_MAGIC = re.compile(r"[*?\[]")


class PlacesError(ValueError):
    """Settings that would let jobs reach the job store; the message names the setting."""


@dataclass(frozen=True)
class Place:
    """A parsed location: a filesystem name and an absolute path on it (for a URL with a
    host or bucket, `/<host>/<path>`)."""

    scheme: str  # "file" for local paths
    path: str

    def holds(self, other: Place) -> bool:
        if self.scheme != other.scheme:
            return False
        root = self.path.rstrip("/")
        return other.path == root or other.path.startswith(root + "/") or root == ""

    def touches(self, other: Place) -> bool:
        """One holds the other."""
        return self.holds(other) or other.holds(self)


def place(url: str) -> Place | None:
    """`url` parsed, or None when it cannot be a place a job reads or writes (see the
    module's docstring)."""
    text = url.strip()
    if not text or "::" in text or _CONTROL.search(text):
        return None
    protocol, path = fsspec.core.split_protocol(text)
    scheme = (protocol or "").lower()
    if scheme in _LOCAL:
        return local_place(os.path.abspath(path))
    if _AMBIGUOUS.search(text):
        return None
    parts = urllib.parse.urlsplit(text)
    host = parts.netloc.lower()
    if not host:
        return None
    return _remote(_ALIASES.get(scheme, scheme), f"{host}/{parts.path}")


def _remote(scheme: str, path: str) -> Place | None:
    """`host/path` on a remote filesystem: empty segments dropped, `.` and `..` refused."""
    segments = [s for s in path.split("/") if s]
    if not segments or any(s in (".", "..") for s in segments):
        return None
    return Place(scheme, "/" + "/".join(segments))


def local_place(path: str) -> Place:
    return Place("file", os.path.realpath(path))


def fs_place(fs: Any, path: str) -> Place | None:
    """A path on a filesystem fsspec opened, parsed as `place` does (None: no place)."""
    if isinstance(fs, LocalFileSystem):
        return local_place(path)
    if "://" in path:  # the http filesystem's paths are whole URLs
        return place(path)
    if _CONTROL.search(path):
        return None
    protocol = str(fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol)
    return _remote(_ALIASES.get(protocol, protocol), path)


def glob_base(url: str) -> str | None:
    """The fixed part of a glob (up to the last `/` before its first wildcard); None when
    `url` is no glob."""
    found = _MAGIC.search(url)
    if found is None:
        return None
    return url[: url.rfind("/", 0, found.start()) + 1] or "."


class Guard:
    """The places a job may read (or write), the fences no place may touch but the ones
    inside them, and `refusal`, the message every refusal carries."""

    def __init__(
        self, places: Iterable[Place], refusal: str = INPUT_REFUSAL, fences: Iterable[Place] = ()
    ) -> None:
        self.places = tuple(places)
        self.refusal = refusal
        self.fences = tuple(fences)

    @classmethod
    def of(
        cls, prefixes: Iterable[str], refusal: str = INPUT_REFUSAL, fences: Iterable[str] = ()
    ) -> Guard:
        found = [place(p) for p in prefixes]
        walls = [place(f) for f in fences]
        return cls([p for p in found if p], refusal, [w for w in walls if w])

    @staticmethod
    def _urls(places: Iterable[Place]) -> list[str]:
        return [
            p.path if p.scheme == "file" else f"{p.scheme}://{p.path.lstrip('/')}" for p in places
        ]

    def urls(self) -> list[str]:
        """The places as prefixes `Guard.of` reads back."""
        return self._urls(self.places)

    def fence_urls(self) -> list[str]:
        return self._urls(self.fences)

    def with_places(self, extra: Iterable[Place | None]) -> Guard:
        return Guard((*self.places, *(p for p in extra if p)), self.refusal, self.fences)

    def allows(self, where: Place | None) -> bool:
        if where is None:
            return False
        walls = [f for f in self.fences if f.touches(where)]
        return any(p.holds(where) and all(f.holds(p) for f in walls) for p in self.places)

    def denied(self, what: str) -> GatewayError:
        return GatewayError(Kind.PERMISSION_DENIED, f"{what} {self.refusal}")

    def check_place(self, url: str, what: str) -> Place:
        """The place `url` names, parsed, when the guard allows it (a glob: its fixed part
        too); else PERMISSION_DENIED "<what> <url> <refusal>". No I/O but a local path's
        symlinks: call it per manifest line, before opening anything."""
        where = place(url)
        base = glob_base(url)
        if not self.allows(where) or (base is not None and not self.allows(place(base))):
            raise self.denied(f"{what} {url}")
        assert where is not None
        return where

    def check_url(self, url: str, what: str) -> None:
        self.check_place(url, what)

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


def check_prefixes(setting: str, prefixes: Iterable[str], store: str) -> list[Place]:
    """The prefixes of `setting` parsed; PlacesError when one is no place, or overlaps the
    job store `store` (holds it, or lies in it): callers could read or overwrite other
    callers' uploads and results."""
    wall = place(store)
    found = []
    for prefix in prefixes:
        where = place(prefix)
        if where is None:
            raise PlacesError(
                f"{setting}: {prefix!r} is not a prefix the gateway can compare (a fragment, "
                "query, user information, percent-escape or ./.. segment, or a chained URL)"
            )
        if wall is not None and wall.touches(where):
            raise PlacesError(
                f"{setting}: {prefix} overlaps the job store {store} (GATEWAY_JOB_STORE): "
                "callers could read or write other callers' uploads and results; allow the "
                "datasets' own prefix (a sibling of the store), or move the store"
            )
        found.append(where)
    return found
