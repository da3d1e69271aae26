"""`[models.NAME.batching]`: whether and how the gateway coalesces a model's requests into
one Predict (gateway.core.coalescer), read from the model config file.

    [models.classifier.batching]
    enabled = true        # default: true wherever the signature's batch dimension is free
    max_batch = 8         # images per Predict; default 8 (1 when the signature fixes it at 1)
    max_delay_ms = 0      # how long an image may wait for company when the model is idle

Unset keys stay None here: their defaults depend on the signature, which only the plan
(gateway.core.batching) knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError, read_integer, refuse_unknown

# Images per Predict at most: past a few dozen a batch only adds latency on CPU, and a
# larger value is more likely a typo than a plan (TF Serving's own default is 1000).
MAX_BATCH_LIMIT = 256
# The longest wait for company an operator may configure: beyond a second it is no longer
# online serving.
MAX_DELAY_LIMIT_MS = 1000.0

_KEYS = {"enabled", "max_batch", "max_delay_ms"}


@dataclass(frozen=True)
class BatchingConfig:
    enabled: bool | None = None  # None: batch wherever the signature allows it
    max_batch: int | None = None  # None: 8 (1 for a batch fixed at 1)
    max_delay_ms: float = 0.0


def read_batching(table: Mapping[str, Any], path: Path, where: str) -> BatchingConfig:
    """The `[batching]` table at `where` (e.g. models.NAME.batching) of the file at `path`."""
    refuse_unknown(table, _KEYS, str(path), where + ".")
    enabled = table.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise ModelConfigError(f"{path}: {where}.enabled must be true or false, got {enabled!r}")
    max_batch = read_integer(table, "max_batch", path, where)
    if max_batch is not None and max_batch > MAX_BATCH_LIMIT:
        raise ModelConfigError(
            f"{path}: {where}.max_batch must be at most {MAX_BATCH_LIMIT}, got {max_batch}"
        )
    delay = table.get("max_delay_ms", 0)
    if (
        not isinstance(delay, int | float)
        or isinstance(delay, bool)
        or not 0 <= delay <= MAX_DELAY_LIMIT_MS
    ):
        raise ModelConfigError(
            f"{path}: {where}.max_delay_ms must be a number of milliseconds in "
            f"[0, {MAX_DELAY_LIMIT_MS:g}], got {delay!r}"
        )
    if enabled is False and (max_batch is not None or delay):
        raise ModelConfigError(
            f"{path}: {where} has enabled = false with max_batch or max_delay_ms; "
            "remove them or enable batching"
        )
    return BatchingConfig(enabled, max_batch, float(delay))
