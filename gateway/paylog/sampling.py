"""Which requests the payload log records, per caller (--payload-log-config /
GATEWAY_PAYLOAD_LOG_CONFIG): the quota file's shape (gateway.policy.quotas), its own keys.

    [default]                  # every caller the file does not name
    rate = 0.01                # share of requests (images) logged, 0 to 1
    images = "hash"            # "hash": the image's SHA-256 only; "full": the image itself

    [callers."uri:spiffe://cluster.local/ns/shop/sa/checkout"]
    rate = 1.0                 # keys left out are [default]'s

    [callers."uri:spiffe://cluster.local/ns/batch/*"]
    rate = 0                   # never logged

Callers are gateway.identity's typed identities ("uri:...", "cn:...", "anonymous"); a caller
gets the table naming it exactly, else the longest pattern that matches it (fnmatch), else
[default]. Without a file every request is logged with its image's hash. A key that does not
exist or a value that cannot be one is refused naming it: at startup the gateway does not
start; on a reload the previous settings stay (logged, and counted in
vision_gateway_payload_log_config_reloads_total{result="error"}).
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

log = logging.getLogger("gateway.paylog")

HASH, FULL = "hash", "full"
KEYS = ("rate", "images")
# A few hundred lines at most; anything far larger is a mistake to refuse.
MAX_FILE_BYTES = 1024 * 1024
# How often the file is looked at for a change (one stat, on the request path).
CHECK_SECONDS = 1.0
_PATTERN = re.compile(r"[*?\[]")

RELOADS = Counter(
    "vision_gateway_payload_log_config_reloads",
    "Payload log config loads after a change, by result: ok, or error (the previous stays).",
    ["result"],
)


class PaylogError(ValueError):
    """A payload log setting or file that cannot be used, naming the setting or key."""


@dataclass(frozen=True)
class Sampling:
    """One caller's payload logging: the share of its requests logged, and how images are."""

    rate: float = 1.0
    images: str = HASH


@dataclass(frozen=True)
class Policy:
    default: Sampling = Sampling()
    exact: Mapping[str, Sampling] = field(default_factory=dict)
    patterns: tuple[tuple[str, Sampling], ...] = ()  # longest first

    def of(self, caller: str) -> Sampling:
        found = self.exact.get(caller)
        if found is not None:
            return found
        for pattern, sampling in self.patterns:
            if fnmatch.fnmatchcase(caller, pattern):
                return sampling
        return self.default


EVERYTHING = Policy()


def parse(text: str, source: str) -> Policy:
    """The policy in the TOML `text` of the file `source`; PaylogError naming the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PaylogError(f"{source}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - {"default", "callers"})
    if unknown:
        raise PaylogError(
            f"{source}: unknown key {unknown[0]!r}; the file has [default] and "
            '[callers."<identity>"] tables'
        )
    base = _table(data.get("default", {}), "[default]", source, Sampling())
    callers = data.get("callers", {})
    if not isinstance(callers, dict):
        raise PaylogError(f'{source}: callers must be tables: [callers."<identity>"]')
    exact: dict[str, Sampling] = {}
    patterns: list[tuple[str, Sampling]] = []
    for name, table in callers.items():
        where = f"[callers.{name!r}]"
        if not name:
            raise PaylogError(f"{source}: {where}: the identity is empty")
        sampling = _table(table, where, source, base)
        if _PATTERN.search(name):
            patterns.append((name, sampling))
        else:
            exact[name] = sampling
    patterns.sort(key=lambda item: -len(item[0]))  # stable: ties keep the file's order
    return Policy(base, exact, tuple(patterns))


def _table(table: Any, where: str, source: str, base: Sampling) -> Sampling:
    if not isinstance(table, dict):
        raise PaylogError(f"{source}: {where} must be a table with {', '.join(KEYS)}")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise PaylogError(
            f"{source}: {where}: unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}"
        )
    rate, images = base.rate, base.images
    if "rate" in table:
        rate = table["rate"]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or math.isnan(rate):
            raise PaylogError(f"{source}: {where}: rate must be a number, got {rate!r}")
        if not 0 <= rate <= 1:
            raise PaylogError(
                f"{source}: {where}: rate must be in [0, 1] (the share of requests logged), "
                f"got {rate!r}"
            )
    if "images" in table:
        images = table["images"]
        if images not in (HASH, FULL):
            raise PaylogError(
                f'{source}: {where}: images must be "hash" (SHA-256 only) or "full", got {images!r}'
            )
    return Sampling(float(rate), images)


def load(path: str) -> Policy:
    """The policy in the file at `path`; PaylogError when it cannot be read or used."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise PaylogError(f"cannot read payload log config {path}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise PaylogError(f"payload log config {path} is over {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PaylogError(f"{path}: not UTF-8: {e}") from None
    return parse(text, path)


class PolicyFile:
    """The policy of a file, loaded again when it changes (modification time, size or inode,
    which a ConfigMap update changes), looked at every `interval` seconds at most; a file
    that stops being usable leaves the last good policy."""

    def __init__(self, path: str, interval: float = CHECK_SECONDS) -> None:
        self.path = path
        self.interval = interval
        self._stamp = self._stat()
        self.policy = load(path)
        self._next_check = 0.0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self, now: float) -> Policy:
        if now >= self._next_check:
            self._next_check = now + self.interval
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        return self.policy

    def _reload(self) -> None:
        try:
            policy = load(self.path)
        except PaylogError as e:
            RELOADS.labels("error").inc()
            log.error("payload log config not reloaded; the previous one stays: %s", e)
            return
        RELOADS.labels("ok").inc()
        self.policy = policy
        log.info("payload log config reloaded", extra={"fields": {"path": self.path}})
