"""One reader of per-caller TOML tables: the quota file (gateway.policy.quotas) and the payload
log's sampling file (gateway.paylog.sampling) have this shape, each with its own keys.

    [default]                                          # every caller the file does not name
    ...

    [callers."uri:spiffe://cluster.local/ns/shop/sa/checkout"]   # one caller exactly
    ...                                                # keys left out are [default]'s

    [callers."uri:spiffe://cluster.local/ns/batch/*"]  # a pattern: each caller it matches
    ...

A table names a caller as gateway.identity types it: `uri:<URI SAN>`, `cn:<common name>`, or
`anonymous`; a pattern is one of those with fnmatch's `*`, `?` or `[...]` after the type
(`uri:spiffe://cluster.local/ns/batch/*`, `cn:worker-*`). A name without its type could never
match a caller (identities always carry it), so the file is refused naming the table and the
typed form to write. A caller gets the table naming it exactly, else the longest pattern that
matches it (ties: the file's order), else [default].

The file is read within MAX_FILE_BYTES, and looked at again (one stat) every CHECK_SECONDS at
most: a changed file (modification time, size or inode, which a ConfigMap update changes) is
loaded again, and one that stops being usable leaves the last good tables (logged, counted).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from prometheus_client import Counter

from gateway.identity import ANONYMOUS, CN, URI

# A caller file is a few hundred lines at most; anything far larger is a mistake to refuse.
MAX_FILE_BYTES = 1024 * 1024
# How often a file is looked at for a change (one stat, on the request path).
CHECK_SECONDS = 1.0
PATTERN = re.compile(r"[*?\[]")
TYPES = (URI, CN)

T = TypeVar("T")


class CallersError(ValueError):
    """A caller file that cannot be used, naming the file and the key; each file's reader
    has its own subclass (QuotaError, PaylogError)."""


@dataclass(frozen=True)
class Tables(Generic[T]):
    """A file's tables: [default], the callers named exactly, the patterns (longest first)."""

    default: T
    exact: Mapping[str, T] = field(default_factory=dict)
    patterns: tuple[tuple[str, T], ...] = ()

    def of(self, caller: str) -> T:
        """The table of `caller` (a typed identity)."""
        found = self.exact.get(caller)
        if found is not None:
            return found
        for pattern, table in self.patterns:
            if fnmatch.fnmatchcase(caller, pattern):
                return table
        return self.default

    def named(self, caller: str) -> bool:
        """True when a table names `caller` exactly (the file bounds how many do)."""
        return caller in self.exact


# Reads one table: (its TOML value, where it is for messages, its name ("" for [default]),
# the [default] it inherits from) -> the caller's settings.
ReadTable = Callable[[Any, str, str, T], T]


@dataclass(frozen=True)
class Shape(Generic[T]):
    """What a file holds: its name for messages, its keys, its error and how a table reads;
    where its reloads are counted (by result: ok or error) and logged."""

    what: str  # "quota file", "payload log config"
    keys: tuple[str, ...]
    error: type[CallersError]
    read: ReadTable[T]
    base: T  # what [default] inherits when a key is left out
    reloads: Counter
    log: logging.Logger

    def parse(self, text: str, source: str) -> Tables[T]:
        """The tables in the TOML `text` of the file `source`; self.error naming the key."""
        return parse(text, source, self)


def quoted(name: str) -> str:
    """A caller's name as TOML writes it in a table header."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_name(name: str) -> str | None:
    """Why `name` cannot name a caller (None when it can)."""
    if not name:
        return "the identity is empty"
    if name == ANONYMOUS:
        return None
    kind = next((t for t in TYPES if name.startswith(t)), None)
    if kind is None or not name.removeprefix(kind):
        if "://" in name:
            hint = f"; a URI SAN is written {quoted(URI + name)}"
        elif name.lower().startswith("cn="):
            hint = f"; a common name is written {quoted(CN + name[3:])}"
        else:
            hint = ""
        return (
            "not a typed identity, so it would never match a caller: write uri:<URI SAN>, "
            "cn:<common name> or anonymous, or a pattern of one (uri:spiffe://domain/ns/team/*)"
            + hint
        )
    return None


def parse(text: str, source: str, kind: Shape[T]) -> Tables[T]:
    """The tables in the TOML `text` of the file `source`; kind.error naming the key."""
    error = kind.error
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{source}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - {"default", "callers"})
    if unknown:
        raise error(
            f"{source}: unknown key {unknown[0]!r}; the file has [default] and "
            '[callers."<identity>"] tables'
        )
    base = _read(kind, data.get("default", {}), "[default]", source, "", kind.base)
    callers = data.get("callers", {})
    if not isinstance(callers, dict):
        raise error(f'{source}: callers must be tables: [callers."<identity>"]')
    exact: dict[str, T] = {}
    patterns: list[tuple[str, T]] = []
    for name, table in callers.items():
        where = f"[callers.{quoted(name)}]"
        problem = check_name(name)
        if problem:
            raise error(f"{source}: {where}: {problem}")
        settings = _read(kind, table, where, source, name, base)
        if PATTERN.search(name):
            patterns.append((name, settings))
        else:
            exact[name] = settings
    patterns.sort(key=lambda item: -len(item[0]))  # stable: ties keep the file's order
    return Tables(base, exact, tuple(patterns))


def _read(kind: Shape[T], table: Any, where: str, source: str, name: str, base: T) -> T:
    if not isinstance(table, dict):
        raise kind.error(f"{source}: {where} must be a table with {', '.join(kind.keys)}")
    unknown = sorted(set(table) - set(kind.keys))
    if unknown:
        raise kind.error(
            f"{source}: {where}: unknown key {unknown[0]!r}; the keys are {', '.join(kind.keys)}"
        )
    try:
        return kind.read(table, where, name, base)
    except CallersError as e:
        raise kind.error(f"{source}: {e}") from None


def load(path: str, kind: Shape[T]) -> Tables[T]:
    """The tables of the file at `path`; kind.error when it cannot be read or used."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise kind.error(f"cannot read {kind.what} {path}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise kind.error(f"{kind.what} {path} is over {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise kind.error(f"{path}: not UTF-8: {e}") from None
    return parse(text, path, kind)


class TablesFile(Generic[T]):
    """The tables of a file, loaded again when it changes, looked at every `interval`
    seconds at most; a file that stops being usable leaves the last good tables. Each file's
    subclass names its Shape (`kind`)."""

    kind: Shape[T]

    def __init__(self, path: str, interval: float = CHECK_SECONDS) -> None:
        self.path = path
        self.interval = interval
        self._stamp = self._stat()
        self.tables = load(path, self.kind)
        self.generation = 0  # counts loads, so callers' settings are looked up again
        self._next_check = 0.0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self, now: float) -> Tables[T]:
        if now >= self._next_check:
            self._next_check = now + self.interval
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        return self.tables

    def _reload(self) -> None:
        kind = self.kind
        try:
            tables = load(self.path, kind)
        except CallersError as e:
            kind.reloads.labels("error").inc()
            kind.log.error("%s not reloaded; the previous one stays: %s", kind.what, e)
            return
        kind.reloads.labels("ok").inc()
        self.tables = tables
        self.generation += 1
        kind.log.info(f"{kind.what} reloaded", extra={"fields": {"path": self.path}})
