"""The sections of `python -m bench`'s report, one module each (1 building, 2 overhead,
3 throughput, 4 and 5 footprint, then the targets they are judged on), and the scale they
run at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scale:
    building_repeat: int
    paired_calls: int  # per run
    load_seconds: float
    start_runs: int
    rounds: int  # repeated runs of each figure a target is judged on
    e2e_calls: int  # per run of the recipe-vs-gateway comparison
    cpu_slices: int  # CPU per request: gateway and proxies alternating, slices per run


FULL = Scale(
    building_repeat=25,
    paired_calls=200,
    load_seconds=8.0,
    start_runs=5,
    rounds=3,
    e2e_calls=9,
    cpu_slices=4,
)
QUICK = Scale(
    building_repeat=2,
    paired_calls=5,
    load_seconds=1.5,
    start_runs=1,
    rounds=1,
    e2e_calls=1,
    cpu_slices=1,
)


Facts = dict[str, Any]
