"""Comparing answers of the doors: the same result written as JSON, MessagePack or a
protobuf message turned into a dict."""

from __future__ import annotations

import math
from typing import Any


def same(got: Any, want: Any, where: str = "", tolerance: float = 1e-6) -> None:
    """`got` is `want` but for the request id (each call has its own), float rounding
    (MessagePack carries float32, JSON the shortest decimal of the float32, the client command
    4 or 5 decimals) and int64 (MessagePack an integer, JSON a string)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        keys = set(want) - {"request_id"}
        assert set(got) - {"request_id"} == keys, f"{where}: {sorted(got)} != {sorted(want)}"
        for key in keys:
            same(got[key], want[key], f"{where}.{key}", tolerance)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            same(a, b, f"{where}[{index}]", tolerance)
    elif isinstance(want, float) or isinstance(got, float):
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=tolerance), f"{where}: {got} != {want}"
    elif isinstance(got, int) and isinstance(want, str):
        assert str(got) == want, f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
