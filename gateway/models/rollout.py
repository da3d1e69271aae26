"""`[models.NAME.rollout]`: a candidate version of a model served to a share of its requests
(canary) or sent a copy of them to compare (shadow), read from the model config file.

    [models.detector.rollout]
    current = { version = 3 }               # optional: what requests get otherwise (default:
                                            #   the latest version, as without a rollout)
    canary = { version = 4, weight = 5 }    # or { label = "canary", weight = 5 }: percent
    sticky = "request_id"                   # or "caller"; default: random per request
    shadow = { version = 4, share = 0.2 }   # or { label = "canary", share = 0.2 }

Only requests that name neither a version nor a label take part (gateway.policy.rollout).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError, is_number, is_whole, refuse_unknown

STICKY = ("request_id", "caller")
_KEYS = {"current", "canary", "sticky", "shadow"}


@dataclass(frozen=True)
class Target:
    """A version or a label of the rollout's model (exactly one is set)."""

    version: int | None = None
    label: str | None = None

    def describe(self) -> str:
        """The metrics' `candidate` label and the summary's name for it."""
        return f"version {self.version}" if self.version is not None else f"label {self.label}"


@dataclass(frozen=True)
class RolloutConfig:
    current: Target | None = None  # None: the latest version
    canary: Target | None = None
    weight: float = 0.0  # percent of the requests that go to the canary
    sticky: str | None = None  # None: random per request; else one of STICKY
    shadow: Target | None = None
    share: float = 0.0  # fraction of the requests (served by the current) copied to the shadow


def _target(
    table: Mapping[str, Any], key: str, path: Path, where: str, amount: str | None = None
) -> tuple[Target | None, Any]:
    """`table[key]`, a version or a label (with `amount` when named) and that amount; None
    when the key is left out."""
    if key not in table:
        return None, None
    where = f"{where}.{key}"
    entry = table[key]
    if not isinstance(entry, dict):
        raise ModelConfigError(f"{path}: {where} must be a table, e.g. {{ version = 2, ... }}")
    allowed = {"version", "label"} | ({amount} if amount else set())
    refuse_unknown(entry, allowed, str(path), where + ".")
    version, label = entry.get("version"), entry.get("label")
    if (version is None) == (label is None):
        raise ModelConfigError(f"{path}: {where} must name one of version or label")
    if version is not None and (not is_whole(version) or version < 1):
        raise ModelConfigError(
            f"{path}: {where}.version must be a whole number >= 1, got {version!r}"
        )
    if label is not None and (not isinstance(label, str) or not label):
        raise ModelConfigError(f"{path}: {where}.label must be a version label, got {label!r}")
    if amount and amount not in entry:
        raise ModelConfigError(f"{path}: {where} needs {amount}")
    return Target(version, label), entry.get(amount) if amount else None


def _candidate(
    table: Mapping[str, Any], key: str, path: Path, where: str, amount: str, unit: str, high: int
) -> tuple[Target | None, float]:
    """A candidate (canary, shadow) and its amount, a `unit` in (0, high]; (None, 0.0) when
    the key is left out."""
    target, value = _target(table, key, path, where, amount)
    if target is None:
        return None, 0.0
    if not is_number(value) or not 0 < value <= high:
        raise ModelConfigError(
            f"{path}: {where}.{key}.{amount} must be a {unit} in (0, {high}], got {value!r}"
        )
    return target, float(value)


def read_rollout(table: Mapping[str, Any], path: Path, where: str) -> RolloutConfig | None:
    """The `[rollout]` table at `where` (e.g. models.NAME.rollout) of the file at `path`;
    None when the model has no rollout."""
    refuse_unknown(table, _KEYS, str(path), where + ".")
    if not table:
        return None
    if "canary" not in table and "shadow" not in table:
        raise ModelConfigError(f"{path}: {where} needs canary or shadow (or both)")
    current, _ = _target(table, "current", path, where)
    canary, weight = _candidate(table, "canary", path, where, "weight", "percentage", 100)
    sticky = table.get("sticky")
    if sticky is not None:
        if sticky not in STICKY:
            raise ModelConfigError(
                f"{path}: {where}.sticky must be one of {', '.join(STICKY)}, got {sticky!r}"
            )
        if canary is None:
            raise ModelConfigError(f"{path}: {where}.sticky applies to a canary; add canary")
    shadow, share = _candidate(table, "shadow", path, where, "share", "fraction", 1)
    for name, target in (("canary", canary), ("shadow", shadow)):
        if target is not None and current is not None and target == current:
            raise ModelConfigError(
                f"{path}: {where}.{name} is the same {target.describe()} as current; "
                "a candidate must differ from what requests get otherwise"
            )
    return RolloutConfig(current, canary, weight, sticky, shadow, share)
