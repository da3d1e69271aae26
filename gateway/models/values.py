"""What every table of the model config file shares: ModelConfigError, the keys every
model has, and reading one value with an error that
names the file and the key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# The keys of [models.NAME] every task shares, read here (gateway.models.file); a task reads
# the others (its request defaults, its [outputs]) and refuses what it does not know.
COMMON_KEYS = frozenset(
    {"task", "label_map", "labels", "input", "signature", "batching", "rollout", "outputs",
     "limits"}
)


class ModelConfigError(ValueError):
    """A model config file that cannot be used; the message names the file and the key."""


def refuse_unknown(table: Mapping[str, Any], known: set[str], path: str, prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ModelConfigError(
                f"{path}: unknown key '{prefix}{key}' (known here: {', '.join(sorted(known))})"
            )


def as_table(value: Any, path: Path, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ModelConfigError(f"{path}: {where} must be a table")
    return value


def read_file_name(table: Mapping[str, Any], key: str, path: Path, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ModelConfigError(f"{path}: {where}.{key} must be a file name")
    return value


def read_number(
    table: Mapping[str, Any],
    key: str,
    path: Path,
    where: str,
    low: float,
    high: float | None,
) -> float | None:
    if key not in table:
        return None
    value = table[key]
    ok = is_number(value)
    if ok and (value <= low if high is None else not low <= value <= high):
        ok = False
    if not ok:
        bound = f"above {low}" if high is None else f"in [{low}, {high}]"
        raise ModelConfigError(f"{path}: {where}.{key} must be a number {bound}, got {value!r}")
    return float(value)


def read_integer(table: Mapping[str, Any], key: str, path: Path, where: str) -> int | None:
    if key not in table:
        return None
    value = table[key]
    if not is_whole(value) or value < 1:
        raise ModelConfigError(f"{path}: {where}.{key} must be a whole number >= 1, got {value!r}")
    return value


def read_size(
    table: Mapping[str, Any], key: str, path: Path, where: str, high: int | None = None
) -> tuple[int, int] | None:
    """`[height, width]` in pixels, whole numbers from 1 (to `high`); None when left out."""
    top = high if high is not None else float("inf")
    bound = f" (1 to {high})" if high is not None else ""
    value = _read_list(
        table, key, path, where, 2, lambda v: is_whole(v) and 0 < v <= top,
        f"[height, width] in pixels{bound}",
    )  # fmt: skip
    return None if value is None else (value[0], value[1])


def read_triple(
    table: Mapping[str, Any], key: str, path: Path, where: str
) -> tuple[float, float, float] | None:
    value = _read_list(
        table, key, path, where, 3, is_number,
        "three numbers, one per channel in the model's channel_order",
    )  # fmt: skip
    return None if value is None else (float(value[0]), float(value[1]), float(value[2]))


def _read_list(
    table: Mapping[str, Any],
    key: str,
    path: Path,
    where: str,
    length: int,
    fits: Callable[[Any], bool],
    meaning: str,
) -> list[Any] | None:
    """A list of `length` values that each `fits`; None when left out."""
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or len(value) != length or not all(map(fits, value)):
        raise ModelConfigError(f"{path}: {where}.{key} must be {meaning}")
    return value


def is_whole(value: Any) -> bool:
    """An integer, not a bool (TOML's true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An integer or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_choice(
    table: Mapping[str, Any], key: str, allowed: tuple[str, ...], path: Path, where: str
) -> str | None:
    if key not in table:
        return None
    value = table[key]
    if value not in allowed:
        raise ModelConfigError(
            f"{path}: {where}.{key} must be one of {', '.join(allowed)}, got {value!r}"
        )
    return str(value)
