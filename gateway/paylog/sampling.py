"""Which requests the payload log records, per caller (--payload-log-config /
GATEWAY_PAYLOAD_LOG_CONFIG): the quota file's shape (gateway.policy.quotas), its own keys.

    [default]                  # every caller the file does not name
    rate = 0.01                # share of requests (images) logged, 0 to 1
    images = "hash"            # "hash": the image's SHA-256 only; "full": the image itself

    [callers."uri:spiffe://cluster.local/ns/shop/sa/checkout"]
    rate = 1.0                 # keys left out are [default]'s

    [callers."uri:spiffe://cluster.local/ns/batch/*"]
    rate = 0                   # never logged

The per-caller tables of gateway.policy.callers: callers are gateway.identity's typed
identities ("uri:...", "cn:...", "anonymous") or patterns of them (a table named otherwise is
refused); a caller gets the table naming it exactly, else the longest pattern that matches it
(fnmatch), else [default]. Without a file every request is logged with its image's hash.
A key that does not exist or a value that cannot be one is refused naming it: at startup
the gateway does not start; on a reload the previous settings stay (logged, and counted in
vision_gateway_payload_log_config_reloads_total{result="error"}).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from gateway.policy.callers import CallersError, Shape, Tables, TablesFile

log = logging.getLogger("gateway.paylog")

HASH, FULL = "hash", "full"
KEYS = ("rate", "images")

RELOADS = Counter(
    "vision_gateway_payload_log_config_reloads",
    "Payload log config loads after a change, by result: ok, or error (the previous stays).",
    ["result"],
)


class PaylogError(CallersError):
    """A payload log setting or file that cannot be used, naming the setting or key."""


@dataclass(frozen=True)
class Sampling:
    """One caller's payload logging: the share of its requests logged, and how images are."""

    rate: float = 1.0
    images: str = HASH


Policy = Tables[Sampling]


def _read(table: Any, where: str, name: str, base: Sampling) -> Sampling:
    rate, images = base.rate, base.images
    if "rate" in table:
        rate = table["rate"]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or math.isnan(rate):
            raise PaylogError(f"{where}: rate must be a number, got {rate!r}")
        if not 0 <= rate <= 1:
            raise PaylogError(
                f"{where}: rate must be in [0, 1] (the share of requests logged), got {rate!r}"
            )
    if "images" in table:
        images = table["images"]
        if images not in (HASH, FULL):
            raise PaylogError(
                f'{where}: images must be "hash" (SHA-256 only) or "full", got {images!r}'
            )
    return Sampling(float(rate), images)


SHAPE = Shape("payload log config", KEYS, PaylogError, _read, Sampling(), RELOADS, log)
EVERYTHING: Policy = Tables(Sampling())
parse = SHAPE.parse


class PolicyFile(TablesFile[Sampling]):
    """The policy of a file (`tables`), loaded again when it changes (gateway.policy.callers)."""

    kind = SHAPE
