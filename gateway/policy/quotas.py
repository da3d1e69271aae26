"""The quota file (--quotas / GATEWAY_QUOTAS): each caller's rate, burst and concurrency, in
the per-caller tables of gateway.policy.callers.

    [default]                  # every caller the file does not name
    rate = 20                  # requests (images) per second, sustained
    burst = 40                 # requests at once above the rate (the token bucket's size)
    concurrency = 8            # requests in flight at once

    work_rate = 30             # work units per second, sustained (a unit: a megapixel decoded
                               # or pasted, or a megabyte of answer: gateway.domain.Cost)
    work_burst = 60            # work units at once above the work rate
    work_concurrency = 40      # work units in flight at once

    [callers."uri:spiffe://cluster.local/ns/shop/sa/checkout"]
    rate = 200                 # keys left out are [default]'s; inf: no limit

    [callers."uri:spiffe://cluster.local/ns/batch/*"]
    concurrency = 4            # each caller the pattern matches, on its own

Callers are the typed identities of gateway.identity: "uri:<URI SAN>" or "cn:<CN>" (from
a certificate or a trusted x-forwarded-client-cert), or "anonymous"; a table named otherwise
is refused. With no file, or keys left out everywhere, there is no limit but the gateway's
fair share (gateway.policy.fairshare). A key that does not exist, or a value that cannot be
one, is refused naming it: at startup the gateway does not start, on a reload the previous
quotas stay (logged, and counted in vision_gateway_quota_reloads_total{result="error"}).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from gateway.policy.callers import CallersError, Shape, Tables, TablesFile

log = logging.getLogger("gateway.policy")

INF = math.inf
DEFAULT_LABEL = "other"  # the metrics label of callers the file does not name
KEYS = ("rate", "burst", "concurrency", "work_rate", "work_burst", "work_concurrency")
# Keys whose values may be fractions (the others are whole numbers of requests).
_FRACTIONS = ("rate", "work_rate", "work_burst", "work_concurrency")

RELOADS = Counter(
    "vision_gateway_quota_reloads",
    "Quota file loads after a change, by result: ok, or error (the previous quotas stay).",
    ["result"],
)


class QuotaError(CallersError):
    """A quota file that cannot be used, with the file and key named."""


@dataclass(frozen=True)
class Quota:
    """One caller's limits (inf: none) and where they come from."""

    rate: float = INF  # requests per second, sustained
    burst: float = INF  # requests at once above the rate
    concurrency: float = INF  # requests in flight
    work_rate: float = INF  # work units per second, sustained (gateway.domain.Cost.units)
    work_burst: float = INF  # work units at once above the work rate
    work_concurrency: float = INF  # work units in flight
    label: str = DEFAULT_LABEL  # the metrics label: the table's name, or "other"
    # The table, for the caller's messages ([default], [callers."..."]): never the file's
    # path on the server.
    source: str = "no quota file"


Quotas = Tables[Quota]


def _read(table: Any, where: str, name: str, base: Quota) -> Quota:
    values = {key: base.__dict__[key] for key in KEYS}
    for key in KEYS:
        if key in table:
            values[key] = _number(table[key], key, where)
    if "rate" in table and "burst" not in table:
        # One second's worth: a caller at its rate never waits on the bucket's size.
        values["burst"] = INF if values["rate"] == INF else max(1.0, math.ceil(values["rate"]))
    if "burst" in table and values["rate"] == INF:
        raise QuotaError(f"{where}: burst needs a rate (requests per second)")
    if "work_rate" in table and "work_burst" not in table:
        rate = values["work_rate"]
        values["work_burst"] = INF if rate == INF else rate  # one second's worth
    if "work_burst" in table and values["work_rate"] == INF:
        raise QuotaError(f"{where}: work_burst needs a work_rate (work units per second)")
    return Quota(label=name or DEFAULT_LABEL, source=f"{where} of the quota file", **values)


def _number(value: Any, key: str, where: str) -> float:
    whole = key not in _FRACTIONS
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QuotaError(f"{where}: {key} must be a number, got {value!r}")
    if value == INF:
        return INF
    if math.isnan(value) or value <= 0 or (whole and (value != int(value) or value < 1)):
        kind = "a whole number >= 1" if whole else "a number > 0"
        raise QuotaError(f"{where}: {key} must be {kind} or inf, got {value!r}")
    return float(value)


SHAPE = Shape("quota file", KEYS, QuotaError, _read, Quota(), RELOADS, log)
NO_QUOTAS: Quotas = Tables(Quota())
parse = SHAPE.parse


class QuotaFile(TablesFile[Quota]):
    """The quotas of a file (`tables`), loaded again when it changes (gateway.policy.callers)."""

    kind = SHAPE
