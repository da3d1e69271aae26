"""The runner's progress report: a tqdm bar on a terminal, else one JSON line on stderr every
few seconds."""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any


class ProgressReport:
    def __init__(self, shard: int, interval: float = 5.0, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.shard = shard
        self.interval = interval
        self.started = time.monotonic()
        self.last_log = self.started
        self.bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=None, unit="img", file=self.stream, dynamic_ncols=True)

    def update(self, done: int, errors: int, total: int | None, resumed: int) -> None:
        """`done`: lines written in this run; `total`: this run's expected lines (estimate)."""
        now = time.monotonic()
        if self.bar is not None:
            if total is not None and self.bar.total != total:
                self.bar.total = total
            self.bar.n = done
            self.bar.set_postfix(errors=errors, resumed=resumed, refresh=False)
            self.bar.refresh()
            return
        if now - self.last_log >= self.interval:
            self.last_log = now
            self.log(done, errors, total, resumed)

    def log(
        self, done: int, errors: int, total: int | None, resumed: int, event: str = "progress"
    ) -> None:
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if total is not None and rate > 0 else None
        record = {
            "event": event,
            "shard": self.shard,
            "done": done,
            "total": total,
            "errors": errors,
            "resumed": resumed,
            "images_per_second": round(rate, 1),
            "elapsed_seconds": round(elapsed, 1),
            "eta_seconds": None if eta is None else round(max(eta, 0.0), 1),
        }
        print(json.dumps(record), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
