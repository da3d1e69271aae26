"""Waiting for events, not for time: poll a condition until it holds, failing with what was
awaited once a generous deadline passes (docs/testing.md's rule)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    """Polls `condition()` every 20 ms until it is true; fails naming `what` after `timeout`
    seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)
