"""The quota file (--quotas / GATEWAY_QUOTAS): each caller's rate, burst and concurrency.

    [default]                  # every caller the file does not name
    rate = 20                  # requests (images) per second, sustained
    burst = 40                 # requests at once above the rate (the token bucket's size)
    concurrency = 8            # requests in flight at once

    [callers."uri:spiffe://cluster.local/ns/shop/sa/checkout"]
    rate = 200                 # keys left out are [default]'s; inf: no limit

    [callers."uri:spiffe://cluster.local/ns/batch/*"]
    concurrency = 4            # each caller the pattern matches, on its own

Callers are the typed identities of gateway.identity: "uri:<URI SAN>" or "cn:<CN>" (from
a certificate or a trusted x-forwarded-client-cert), or "anonymous". A caller gets the
table naming it exactly, else the longest pattern that matches it (fnmatch: `*`, `?`,
`[...]`), else [default]; with no file, or keys left out everywhere, there is no limit
but the gateway's fair share
(gateway.policy.fairshare). A key that does not exist, or a value that cannot be one, is
refused naming it: at startup the gateway does not start, on a reload the previous quotas
stay (logged, and counted in vision_gateway_quota_reloads_total{result="error"}).
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

log = logging.getLogger("gateway.policy")

INF = math.inf
DEFAULT_LABEL = "other"  # the metrics label of callers the file does not name
KEYS = ("rate", "burst", "concurrency")
# A quota file is a few hundred lines at most; anything far larger is a mistake to refuse.
MAX_FILE_BYTES = 1024 * 1024
# How often the file is looked at for a change (one stat, on the request path).
CHECK_SECONDS = 1.0
_PATTERN = re.compile(r"[*?\[]")

RELOADS = Counter(
    "vision_gateway_quota_reloads",
    "Quota file loads after a change, by result: ok, or error (the previous quotas stay).",
    ["result"],
)


class QuotaError(ValueError):
    """A quota file that cannot be used, with the file and key named."""


@dataclass(frozen=True)
class Quota:
    """One caller's limits (inf: none) and where they come from."""

    rate: float = INF  # requests per second, sustained
    burst: float = INF  # requests at once above the rate
    concurrency: float = INF  # requests in flight
    label: str = DEFAULT_LABEL  # the metrics label: the table's name, or "other"
    source: str = "no quota file"  # the table, for messages: [default], [callers."..."]


@dataclass(frozen=True)
class Quotas:
    default: Quota = Quota()
    exact: Mapping[str, Quota] = field(default_factory=dict)
    patterns: tuple[tuple[str, Quota], ...] = ()  # longest first

    def of(self, caller: str) -> Quota:
        """The quota of `caller` (an identity)."""
        quota = self.exact.get(caller)
        if quota is not None:
            return quota
        for pattern, quota in self.patterns:
            if fnmatch.fnmatchcase(caller, pattern):
                return quota
        return self.default


NO_QUOTAS = Quotas()


def parse(text: str, source: str) -> Quotas:
    """Quotas from the TOML `text` of the file `source`; QuotaError naming the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise QuotaError(f"{source}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - {"default", "callers"})
    if unknown:
        raise QuotaError(
            f"{source}: unknown key {unknown[0]!r}; the file has [default] and "
            '[callers."<identity>"] tables'
        )
    base = _table(data.get("default", {}), "[default]", source, Quota(), DEFAULT_LABEL)
    callers = data.get("callers", {})
    if not isinstance(callers, dict):
        raise QuotaError(f'{source}: callers must be tables: [callers."<identity>"]')
    exact: dict[str, Quota] = {}
    patterns: list[tuple[str, Quota]] = []
    for name, table in callers.items():
        where = f"[callers.{_quoted(name)}]"
        if not name:
            raise QuotaError(f"{source}: {where}: the identity is empty")
        quota = _table(table, where, source, base, name)
        if _PATTERN.search(name):
            patterns.append((name, quota))
        else:
            exact[name] = quota
    patterns.sort(key=lambda item: -len(item[0]))  # stable: ties keep the file's order
    return Quotas(base, exact, tuple(patterns))


def _table(table: Any, where: str, source: str, base: Quota, label: str) -> Quota:
    if not isinstance(table, dict):
        raise QuotaError(f"{source}: {where} must be a table with {', '.join(KEYS)}")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise QuotaError(
            f"{source}: {where}: unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}"
        )
    values = {key: base.__dict__[key] for key in KEYS}
    for key in KEYS:
        if key in table:
            values[key] = _number(table[key], key, where, source)
    if "rate" in table and "burst" not in table:
        # One second's worth: a caller at its rate never waits on the bucket's size.
        values["burst"] = INF if values["rate"] == INF else max(1.0, math.ceil(values["rate"]))
    if "burst" in table and values["rate"] == INF:
        raise QuotaError(f"{source}: {where}: burst needs a rate (requests per second)")
    return Quota(label=label, source=f"{where} of {source}", **values)


def _number(value: Any, key: str, where: str, source: str) -> float:
    whole = key != "rate"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QuotaError(f"{source}: {where}: {key} must be a number, got {value!r}")
    if value == INF:
        return INF
    if math.isnan(value) or value <= 0 or (whole and (value != int(value) or value < 1)):
        kind = "a whole number >= 1" if whole else "a number > 0 (requests per second)"
        raise QuotaError(f"{source}: {where}: {key} must be {kind} or inf, got {value!r}")
    return float(value)


def _quoted(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def load(path: str) -> Quotas:
    """The quota file at `path`; QuotaError when it cannot be read or used."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise QuotaError(f"cannot read quota file {path}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise QuotaError(f"quota file {path} is over {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise QuotaError(f"{path}: not UTF-8: {e}") from None
    return parse(text, path)


class QuotaFile:
    """The quotas of a file, loaded again when it changes (its modification time, size or
    inode, which a Kubernetes ConfigMap update changes), looked at every `interval`
    seconds at most; a file that stops being usable leaves the last good quotas."""

    def __init__(self, path: str, interval: float = CHECK_SECONDS) -> None:
        self.path = path
        self.interval = interval
        self._stamp = self._stat()
        self.quotas = load(path)
        self.generation = 0  # counts loads, so callers' quotas are looked up again
        self._next_check = 0.0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self, now: float) -> Quotas:
        if now >= self._next_check:
            self._next_check = now + self.interval
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        return self.quotas

    def _reload(self) -> None:
        try:
            quotas = load(self.path)
        except QuotaError as e:
            RELOADS.labels("error").inc()
            log.error("quota file not reloaded; the previous quotas stay: %s", e)
            return
        RELOADS.labels("ok").inc()
        self.quotas = quotas
        self.generation += 1
        log.info("quota file reloaded", extra={"fields": {"path": self.path}})
