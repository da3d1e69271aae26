"""The job store's bound as the local executor's runners see it: every result byte a job
writes into the store is reserved here first (gateway.batch.budget), so the store never
passes GATEWAY_JOB_STORE_MAX_BYTES because of results, and a job whose next write does not
fit fails RESOURCE_EXHAUSTED naming the setting.

The bytes in the store are measured (the store's `usage`) when a reservation finds the
measure older than MEASURE_SECONDS; reservations and deletions since are added to it, under
one lock per process. Between measures, what other processes (replicas, uploads) wrote or
deleted is not seen: a tally the store keeps itself (conditional writes) would make this
exact; `reserve` and `release` are the interface it would back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gateway.batch.budget import BudgetSpent
from gateway.jobs.uploads import store_full

MEASURE_SECONDS = 5.0


class StoreBudget:
    def __init__(
        self, usage: Callable[[], int], limit: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._usage = usage  # bytes in the store now (blocking)
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._measured = 0
        self._since = 0  # reserved minus released since the measure
        self._at: float | None = None

    def _measure(self) -> None:
        self._measured = self._usage()
        self._since = 0
        self._at = self._clock()

    @property
    def used(self) -> int:
        return self._measured + self._since

    def reserve(self, size: int) -> None:
        with self._lock:
            if self._at is None or self._clock() - self._at > MEASURE_SECONDS:
                self._measure()
            if self.used + size > self.limit:
                raise BudgetSpent(store_full(self.used, self.limit).message)
            self._since += size

    def release(self, size: int) -> None:
        with self._lock:
            self._since -= size
