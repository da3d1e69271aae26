"""The payload log: each image's request and answer, sampled per caller, queued within a byte
budget and written by one thread, so logging never blocks or fails a request.

On the request path (the pipeline's observer, on the event loop): the caller's sampling
(gateway.paylog.sampling), then a reservation of the record's bytes against
GATEWAY_PAYLOAD_LOG_QUEUE_BYTES, taken before the record is made. The reservation counts the
whole record, as it is held and as it is written (`cost`): the image and, with images =
"full", its base64 twice (in the event and in its JSON), the caller's strings, and the answer
three times (the outcome kept, its JSON-ready form and its JSON text, alive together while the
event is written), the answer measured by walking it (`held`). A record that does not fit is
dropped and counted (vision_gateway_payload_log_records_total{result="dropped"}); nothing
waits. Hashing, base64 and JSON happen in the writer thread, which gives a record's
reservation back once its sink has it. A stalled sink (an HTTP endpoint that never answers,
a FIFO nobody reads) stalls only that thread: the queue fills and further records are dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge

from gateway.api.bindings import Bindings
from gateway.config import Settings
from gateway.domain import ModelRef, Outcome, Request
from gateway.errors import GatewayError
from gateway.paylog import sinks
from gateway.paylog.events import Record, event
from gateway.paylog.sampling import EVERYTHING, FULL, PaylogError, Policy, PolicyFile, Sampling

log = logging.getLogger("gateway.paylog")

# What a record costs besides its image: the outcome, the request's fields and their JSON
# (a detection result of 100 boxes is about 20 KB of JSON, held only while it is written).
RECORD_OVERHEAD = 4096
# Records taken from the queue at once: one write (and one flush) per batch on a file.
BATCH = 64
# Seconds the writer gets to empty the queue at shutdown; what is left then is counted as
# unsent, so a stalled sink cannot hold the gateway's exit.
CLOSE_SECONDS = 5.0
_KEEP = 4096  # callers' sampling cached (identities seen once fall out with the rest)

RECORDS = Counter(
    "vision_gateway_payload_log_records",
    "Payload log records (one per image logged) by result: queued; dropped (the queue's byte "
    "budget was full); written; failed (the sink refused or did not answer); unsent (left in "
    "the queue at shutdown).",
    ["result"],
)
QUEUE_BYTES = Gauge(
    "vision_gateway_payload_log_queue_bytes",
    "Bytes reserved by payload log records queued or being written.",
    multiprocess_mode="livesum",
)


# CPython's sizes: a number object, a list's slot, an empty list or str (about).
_NUMBER, _SLOT, _EMPTY = 32, 8, 56
# A walk deeper than this is not an answer the tasks make; it is counted as its top only.
_DEPTH = 12


_NUMBERS = frozenset({int, float, np.float32, np.float64, np.int32, np.int64})
_SCALARS = _NUMBERS | {bool, type(None)}
_TEXTS = frozenset({str, bytes, bytearray})


def held(value: Any, depth: int = 0) -> int:
    """About the bytes `value` holds in memory: strings and bytes by their length, arrays by
    theirs, numbers and containers by CPython's sizes; a list of numbers by its length alone
    (never element by element), and scalars inside a container without a call each, so a walk
    costs about one step per object that holds others."""
    kind = type(value)
    if kind in _TEXTS:
        return _EMPTY + len(value)
    if kind in _SCALARS:
        return _NUMBER
    if kind is np.ndarray:
        return _EMPTY + int(value.nbytes)
    if depth >= _DEPTH:
        return _EMPTY
    if isinstance(value, list | tuple):
        if not value:
            return _EMPTY
        # A plain list or tuple that starts and ends with numbers is a list of numbers (a
        # polygon, a vector); a named tuple's fields are walked.
        if (kind is list or kind is tuple) and (
            type(value[0]) in _NUMBERS and type(value[-1]) in _NUMBERS
        ):
            return _EMPTY + len(value) * (_SLOT + _NUMBER)
        total = _EMPTY + len(value) * _SLOT
        for item in value:
            item_kind = type(item)
            if item_kind in _SCALARS:
                total += _NUMBER
            elif item_kind in _TEXTS:
                total += _EMPTY + len(item)
            else:
                total += held(item, depth + 1)
        return total
    if isinstance(value, dict):
        return _EMPTY + sum(
            held(k, depth + 1) + held(v, depth + 1) + 2 * _SLOT for k, v in value.items()
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _EMPTY + sum(
            _SLOT + held(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)
        )
    return _EMPTY


def cost(image_bytes: int, full: bool, answer_bytes: int = 0, strings: Iterable[str] = ()) -> int:
    """The bytes a record reserves: the image held until written (with images = "full" its
    base64 in the event and in the JSON text too), the caller's strings (request id, trace
    headers, error message) twice (kept and written), and the answer's `answer_bytes` three
    times: the outcome, its JSON-ready form and its JSON text."""
    base64_bytes = (image_bytes + 2) // 3 * 4 if full else 0
    texts = sum(len(text) for text in strings)
    return RECORD_OVERHEAD + image_bytes + 2 * base64_bytes + 2 * texts + 3 * answer_bytes


class PayloadLog:
    """Called by the pipeline once per image (never raises); writes in a thread of its own."""

    def __init__(
        self,
        sink: sinks.AnySink,
        bindings: Bindings,
        budget: int,
        policy: PolicyFile | Policy = EVERYTHING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.bindings = bindings
        self.budget = budget
        self._file = policy if isinstance(policy, PolicyFile) else None
        self._policy = policy.tables if isinstance(policy, PolicyFile) else policy
        self._cached: dict[str, Sampling] = {}
        self._clock = clock
        self._queue: deque[tuple[Record, int]] = deque()
        self._reserved = 0
        self._lock = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="payload-log", daemon=True)

    @classmethod
    def for_settings(cls, settings: Settings, bindings: Bindings) -> PayloadLog | None:
        """The payload log the settings ask for (None: off); PaylogError naming the setting."""
        if not settings.payload_log:
            return None
        sink = sinks.open_sink(
            settings.payload_log, settings.payload_log_rotate_bytes, settings.payload_log_timeout
        )
        policy: PolicyFile | Policy = EVERYTHING
        if settings.payload_log_config:
            try:
                policy = PolicyFile(settings.payload_log_config)
            except PaylogError as e:
                raise PaylogError(f"GATEWAY_PAYLOAD_LOG_CONFIG: {e}") from None
        return cls(sink, bindings, settings.payload_log_queue_bytes, policy)

    def start(self) -> None:
        self._thread.start()

    @property
    def reserved(self) -> int:
        return self._reserved

    def sampling(self, caller: str) -> Sampling:
        if self._file is not None:
            policy = self._file.current(self._clock())
            if policy is not self._policy:
                self._policy = policy
                self._cached.clear()
        found = self._cached.get(caller)
        if found is None:
            if len(self._cached) >= _KEEP:
                self._cached.clear()
            found = self._cached[caller] = self._policy.of(caller)
        return found

    def __call__(
        self,
        task: str,
        request: Request,
        request_id: str,
        model: ModelRef | None,
        outcome: Outcome | None,
        failure: GatewayError | None,
        seconds: float,
    ) -> None:
        """Offers one image's record: sampled, then queued if its bytes fit the budget."""
        if not request.caller:  # the gateway's own batch work: its results are its record
            return
        try:
            sampling = self.sampling(request.caller)
            if sampling.rate <= 0 or (sampling.rate < 1 and random.random() >= sampling.rate):
                return
            full = sampling.images == FULL
            code = failure.code if failure is not None else "OK"
            message = failure.message if failure is not None else ""
            answer = held(outcome.result) if outcome is not None else 0
            texts = (request_id, request.caller, request.method, message,
                     *(value for _, value in request.trace))  # fmt: skip
            size = cost(len(request.image), full, answer, texts)
            record = Record(
                task, request, request_id, model, outcome, code, message, full, seconds,
                time.time(),
            )  # fmt: skip
            with self._lock:
                if self._closing or self._reserved + size > self.budget:
                    RECORDS.labels("unsent" if self._closing else "dropped").inc()
                    return
                self._reserved += size
                self._queue.append((record, size))
                self._lock.notify()
            RECORDS.labels("queued").inc()
            QUEUE_BYTES.inc(size)
        except Exception:  # a bug here must never cost the request its answer
            log.exception("payload log: record not queued")

    def _take(self) -> list[tuple[Record, int]] | None:
        """The next batch (possibly empty when a timed flush is due); None once closed and
        empty."""
        with self._lock:
            if not self._queue and not self._closing:
                self._lock.wait(self.sink.wait)
            if not self._queue:
                return None if self._closing else []
            return [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                break
            if batch:
                self._write(batch)
            elif self.sink.due():
                self._settle(self.sink.flush())
        self._settle(self.sink.flush())
        self.sink.close()

    def _write(self, batch: list[tuple[Record, int]]) -> None:
        events = []
        for record, _ in batch:
            try:
                events.append(event(record, self.bindings))
            except Exception:  # a bug: that record is lost, counted, and the rest go on
                log.exception("payload log: cannot make the event of a record")
                RECORDS.labels("failed").inc()
        try:
            self._settle(self.sink.write(events))
        finally:
            released = sum(size for _, size in batch)
            with self._lock:
                self._reserved -= released
            QUEUE_BYTES.dec(released)

    @staticmethod
    def _settle(settled: tuple[int, int]) -> None:
        written, failed = settled
        if written:
            RECORDS.labels("written").inc(written)
        if failed:
            RECORDS.labels("failed").inc(failed)

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Stops taking records and gives the writer `timeout` seconds to write the queue;
        records still queued then are counted as unsent (a stalled writer is left behind:
        a daemon thread)."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            with self._lock:
                left = list(self._queue)
                self._queue.clear()
                released = sum(size for _, size in left)
                self._reserved -= released
            QUEUE_BYTES.dec(released)
            if left:
                RECORDS.labels("unsent").inc(len(left))
                log.warning(
                    "payload log: sink stalled at shutdown; records not written",
                    extra={"fields": {"records": len(left)}},
                )
