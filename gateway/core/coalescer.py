"""Per model version: images that queue while a call to the model is in flight go to TF
Serving as one Predict (batch N), and its answer is split back per image.

Each queue holds the images of one model version, input plan and tensor shape (one request
envelope: model spec, signature, output filter). An image that finds its queue idle is sent
alone at once, as it was built (no added delay, no copy). Images that arrive while a call
for their queue is in flight wait; when a call returns, the waiting images (up to max_batch)
go as one Predict, and a full batch goes at once without waiting. `max_delay_ms` > 0 lets
an image arriving at an idle queue wait that long for company.

Each image keeps its own deadline: it leaves with DEADLINE_EXCEEDED when it passes, without
disturbing the batch; a queue is sent before its earliest deadline would leave no time for
the call (judged from its recent calls). A cancelled image leaves its queue, or is simply not
answered when its batch returns. Decoding happens before batching, so a bad image fails
alone. A batch TF Serving refuses for its size or perhaps for one image is sent again in
halves, and a size refusal lowers the queue's batches for a while; a batch refused for load
is not sent again at all: its images are answered OVERLOADED or UNAVAILABLE with a retry
delay (gateway.core.batchlimit). A batch whose outputs lack the batch dimension is answered
image by image, and that queue stops batching.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from gateway import metrics
from gateway.config import MESSAGE_OVERHEAD, Settings
from gateway.core.batching import BatchPlan
from gateway.core.batchlimit import IMAGE, LOAD, SIZE, advised, refusal
from gateway.core.batchqueue import Answer, Item, Metadata, Queue
from gateway.core.inputs import ModelInput
from gateway.domain import ModelRef
from gateway.errors import GatewayError, Kind
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import StaleSignature, TFServingClient
from gateway.upstream.tensors import Tensor, split_batch
from gateway.upstream.wire import batch_request, string_batch_request

log = logging.getLogger("gateway.batching")

# Batches at least this large are stacked in a worker thread: copying megabytes on the event
# loop would hold up every other request for that long.
BUILD_IN_THREAD_BYTES = 1024 * 1024
# Queues kept (one per model version, plan and shape); bounded, idle ones are dropped.
_MAX_QUEUES = 4096


class Coalescer:
    """Sends each image's Predict alone or in a batch (module docstring)."""

    def __init__(
        self,
        client: TFServingClient,
        settings: Settings,
        executor: Executor,
        label: Callable[[str], str] = str,
    ) -> None:
        self._client = client
        self._label = label  # a model's name in metrics (bounded: gateway.metrics.ModelLoad)
        self._timeout_cap = settings.upstream_timeout
        self._max_bytes = max(settings.upstream_send_bytes - MESSAGE_OVERHEAD, 1)
        self._executor = executor
        self._queues: dict[tuple[Any, ...], Queue] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def predict(
        self,
        model: ModelRef,
        plan: BatchPlan,
        envelope: bytes,
        input_key: str,
        model_input: ModelInput,
        deadline: float | None,
        trace: Metadata,
        request_id: str,
    ) -> Answer:
        """The answer for one image; GatewayError like TFServingClient.predict."""
        if not plan.enabled or not model_input.tail:
            return await self._alone(model, model_input.request, deadline, trace, request_id)
        shape: tuple[Any, ...] = model_input.shape[1:]
        if model_input.dtype == tfs.DT_STRING:
            shape = (model_input.sent,)  # encoded images batch with images of their size
        key = (envelope, input_key, model_input.dtype, shape)
        queue = self._queues.get(key)
        if queue is None:
            if len(self._queues) >= _MAX_QUEUES:
                self._drop_idle_queues()
            queue = self._queues[key] = Queue(model, envelope, input_key, plan)
        metric = metrics.QUEUE_WAIT.labels(self._label(model.name))
        if not queue.splittable or (
            queue.in_flight == 0 and not queue.waiting and not queue.max_delay
        ):
            metric.observe(0.0)
            queue.in_flight += 1
            started = time.monotonic()
            try:
                return await self._alone(model, model_input.request, deadline, trace, request_id)
            finally:
                queue.in_flight -= 1
                queue.observe(time.monotonic() - started)
                if queue.waiting:
                    self._dispatch(queue)
        answer = await self._wait(queue, model_input, deadline, trace, request_id)
        metric.observe(answer.waited)
        return answer

    async def _alone(
        self,
        model: ModelRef,
        request: bytes,
        deadline: float | None,
        trace: Metadata,
        request_id: str,
    ) -> Answer:
        try:
            prediction = await self._client.predict(model, request, self._timeout(deadline), trace)
        except GatewayError as exc:
            raise (advised(exc) if refusal(exc) == LOAD else exc) from None
        metrics.BATCH_SIZE.labels(self._label(model.name)).observe(1)
        return Answer(prediction.version, prediction.outputs, 1, 0.0, request_id)

    def _timeout(self, deadline: float | None) -> float:
        if deadline is None:
            return self._timeout_cap
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise GatewayError(Kind.DEADLINE, "the call's deadline passed in the gateway")
        return min(remaining, self._timeout_cap)

    async def _wait(
        self,
        queue: Queue,
        model_input: ModelInput,
        deadline: float | None,
        trace: Metadata,
        request_id: str,
    ) -> Answer:
        loop = asyncio.get_running_loop()
        item = Item(model_input, deadline, trace, request_id, loop.create_future())
        if deadline is not None:
            item.timer = loop.call_later(deadline - item.queued, self._expire, queue, item)
        queue.waiting.append(item)
        if len(queue.waiting) >= queue.limit:
            self._dispatch(queue)
        else:
            self._arm(queue, queue.send_by(item))
        try:
            return await item.future
        except asyncio.CancelledError:
            # The caller is gone: out of the queue, or left unanswered in its batch.
            self._leave(queue, item)
            raise

    def _leave(self, queue: Queue, item: Item) -> None:
        if item.timer is not None:
            item.timer.cancel()
        with contextlib.suppress(ValueError):  # unless taken into a batch already
            queue.waiting.remove(item)

    def _expire(self, queue: Queue, item: Item) -> None:
        if not item.future.done():
            item.future.set_exception(
                GatewayError(
                    Kind.DEADLINE,
                    "the call's deadline passed while its image waited for TF Serving "
                    f"({queue.model.describe()}, answering a batch)",
                )
            )
        self._leave(queue, item)

    def _arm(self, queue: Queue, at: float) -> None:
        """Makes sure the queue is dispatched by `at` (time.monotonic())."""
        if at == float("inf") or (queue.timer is not None and queue.timer_at <= at):
            return
        if queue.timer is not None:
            queue.timer.cancel()
        loop = asyncio.get_running_loop()
        queue.timer = loop.call_later(max(at - time.monotonic(), 0.0), self._dispatch, queue)
        queue.timer_at = at

    def _dispatch(self, queue: Queue) -> None:
        """Sends what waits in `queue`: one batch, then more only while full ones wait."""
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        first = True
        while queue.waiting and (first or len(queue.waiting) >= queue.limit):
            first = False
            items = self._take(queue)
            if items:
                queue.in_flight += 1  # now, so an image arriving meanwhile waits for it
                task = asyncio.get_running_loop().create_task(self._send(queue, items))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if queue.waiting:
            self._arm(queue, min(queue.send_by(item) for item in queue.waiting))

    def _take(self, queue: Queue) -> list[Item]:
        """The next batch: live images, up to max_batch and the upstream send limit."""
        items: list[Item] = []
        size = 0
        limit = queue.limit
        while queue.waiting and len(items) < limit:
            item = queue.waiting[0]
            if item.future.done():  # expired or cancelled
                queue.waiting.popleft()
                continue
            if items and size + item.input.tail > self._max_bytes:
                break
            queue.waiting.popleft()
            items.append(item)
            size += item.input.tail
        return items

    async def _send(self, queue: Queue, items: list[Item]) -> None:
        """A batch's call, as a task of its own: no caller's cancellation reaches it."""
        try:
            await self._call(queue, items)
        except asyncio.CancelledError:
            cancelled = GatewayError(Kind.CANCELLED, "the gateway is shutting down")
            for item in items:
                _fail(item, cancelled)
            raise
        except Exception as exc:  # a bug: each image's pipeline logs it with its traceback
            for item in items:
                _fail(item, exc)
        finally:
            queue.in_flight -= 1
            if queue.waiting:
                self._dispatch(queue)

    async def _call(self, queue: Queue, items: list[Item]) -> None:
        """One Predict for `items`; every item answered or failed."""
        sent = time.monotonic()
        count = len(items)
        until = [item.until for item in items]
        deadline = None if None in until else max(u for u in until if u is not None)
        lead = items[0]
        try:
            request = lead.input.request if count == 1 else await self._stack(queue, items)
            prediction = await self._client.predict(
                queue.model, request, self._timeout(deadline), lead.trace
            )
        except StaleSignature as exc:  # the served version changed: each image plans again
            for item in items:
                _fail(item, exc)
            return
        except GatewayError as exc:
            why = refusal(exc)
            if count > 1 and why in (SIZE, IMAGE):
                await self._halves(queue, items, why)
            else:  # load (never sent again) or the answer for every image
                error = advised(exc) if why == LOAD else exc
                for item in items:
                    _fail(item, error)
            return
        queue.observe(time.monotonic() - sent)
        queue.size.answered(count, time.monotonic())
        metrics.BATCH_SIZE.labels(self._label(queue.model.name)).observe(count)
        parts: list[Mapping[str, Tensor]] | None = [prediction.outputs]
        if count > 1:
            parts = split_batch(prediction.outputs, count)
        if parts is None:
            queue.splittable = False
            log.warning(
                "a batched answer could not be split per image (an output has no batch "
                "dimension); this model's requests go one image per call from now on",
                extra={"fields": {"model": queue.model.describe(), "batch": count}},
            )
            await self._one_by_one(queue, items, "unsplittable")
            return
        for item, outputs in zip(items, parts, strict=True):
            if item.timer is not None:
                item.timer.cancel()
            if not item.future.done():
                waited = sent - item.queued
                answer = Answer(prediction.version, outputs, count, waited, lead.request_id)
                item.future.set_result(answer)

    async def _stack(self, queue: Queue, items: list[Item]) -> bytes:
        """The batch's PredictRequest: each image's tail stacked (see gateway.upstream.wire)."""
        first = items[0].input
        tails = [memoryview(item.input.request)[-item.input.tail :] for item in items]
        if first.dtype == tfs.DT_STRING:
            return string_batch_request(queue.envelope, queue.input_key, tails)
        args = (queue.envelope, queue.input_key, first.dtype, first.shape[1:], tails)
        if sum(item.input.tail for item in items) < BUILD_IN_THREAD_BYTES:
            return batch_request(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, batch_request, *args)

    async def _one_by_one(self, queue: Queue, items: list[Item], reason: str) -> None:
        """Each image of an unsplittable answer's batch sent alone, once."""
        metrics.BATCH_SPLITS.labels(self._label(queue.model.name), reason).inc()
        items = [item for item in items if not item.future.done()]
        await self._each(queue, [[item] for item in items])

    async def _halves(self, queue: Queue, items: list[Item], why: str) -> None:
        """A batch refused for its size, or perhaps for one image, sent again as two halves
        (each split again if refused), so a bad image fails alone and the others are answered;
        two calls where the batch was one, never one per image at once."""
        if why == SIZE:
            self._shrink(queue, len(items), "refused a batch of this size")
        reason = "too_large" if why == SIZE else "refused"
        metrics.BATCH_SPLITS.labels(self._label(queue.model.name), reason).inc()
        live = [item for item in items if not item.future.done()]
        middle = (len(live) + 1) // 2
        await self._each(queue, [part for part in (live[:middle], live[middle:]) if part])
        answered = all(
            item.future.done() and not item.future.cancelled() and item.future.exception() is None
            for item in live
        )
        if why == IMAGE and live and answered:  # no image was the cause: the batch's size was
            self._shrink(queue, len(items), "took in halves a batch it refused whole")

    async def _each(self, queue: Queue, parts: list[list[Item]]) -> None:
        results = await asyncio.gather(
            *(self._call(queue, part) for part in parts), return_exceptions=True
        )
        for part, result in zip(parts, results, strict=True):
            if isinstance(result, BaseException):
                for item in part:
                    _fail(item, result)

    def _shrink(self, queue: Queue, count: int, what: str) -> None:
        before = queue.size.limit
        queue.size.too_large(count, time.monotonic())
        if queue.size.limit < before:
            log.warning(
                f"TF Serving {what}; this model's batches hold at most `limit` images until "
                "batches that size have been answered for a while (set [models.NAME.batching] "
                "max_batch to what TF Serving accepts if this repeats)",
                extra={
                    "fields": {"model": queue.model.describe(), "refused": count,
                               "limit": queue.size.limit, "max_batch": queue.max_batch}
                },
            )  # fmt: skip

    def _drop_idle_queues(self) -> None:
        for key, queue in list(self._queues.items()):
            if not queue.in_flight and not queue.waiting:
                del self._queues[key]


def _fail(item: Item, error: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(error)
