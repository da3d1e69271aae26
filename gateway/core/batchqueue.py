"""One queue of the coalescer (gateway/core/coalescer.py): the images of one model version,
input plan and tensor shape waiting for a call, the running estimate of a call's duration,
and the images a call may hold now (gateway/core/batchlimit.py)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

from gateway.core.batching import BatchPlan
from gateway.core.batchlimit import BatchLimit
from gateway.core.inputs import ModelInput
from gateway.domain import ModelRef
from gateway.upstream.tensors import Tensor

Metadata = tuple[tuple[str, str], ...]
# Weight of the newest call in a queue's running estimate of its call time.
_CALL_TIME_WEIGHT = 0.2


class Answer(NamedTuple):
    """One image's part of a Predict answer."""

    version: int
    outputs: Mapping[str, Tensor]
    batch: int  # images in the call that answered (1: alone)
    waited: float  # seconds the image waited before its call was sent
    lead: str  # request id of the image whose trace headers went with the call


class Item:
    __slots__ = ("future", "input", "queued", "request_id", "timer", "trace", "until")

    def __init__(
        self,
        model_input: ModelInput,
        until: float | None,
        trace: Metadata,
        request_id: str,
        future: asyncio.Future[Answer],
    ) -> None:
        self.input = model_input
        self.until = until  # the caller's deadline (time.monotonic()), or None
        self.trace = trace
        self.request_id = request_id
        self.future = future
        self.queued = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None


class Queue:
    def __init__(self, model: ModelRef, envelope: bytes, key: str, plan: BatchPlan) -> None:
        self.model = model
        self.envelope = envelope
        self.input_key = key
        self.max_batch = plan.max_batch
        self.size = BatchLimit(plan.max_batch)  # lowered while TF Serving refuses the size
        self.max_delay = plan.max_delay
        self.waiting: deque[Item] = deque()
        self.in_flight = 0
        self.call_time = 0.0  # running estimate of a call's duration (0: none seen yet)
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.splittable = True

    @property
    def limit(self) -> int:
        """Images per call now: the size limit, or 1 once answers proved unsplittable."""
        return self.size.limit if self.splittable else 1

    def observe(self, seconds: float) -> None:
        if self.call_time:
            self.call_time += _CALL_TIME_WEIGHT * (seconds - self.call_time)
        else:
            self.call_time = seconds

    def send_by(self, item: Item) -> float:
        """When `item`'s batch must be sent at the latest (time.monotonic())."""
        at = float("inf")
        if self.in_flight == 0 and self.max_delay:
            at = item.queued + self.max_delay
        if item.until is not None:
            # Leave the call the time calls take; before any is known, half the time left.
            margin = self.call_time or (item.until - item.queued) / 2
            at = min(at, item.until - margin)
        return at
