"""The coalescer after TF Serving refuses a batch (gateway/core/batchlimit.py): a batch refused
for load is never sent again (not whole, not image by image) and its images are told when to
retry; a batch refused for its size goes again in halves, the model's batches shrink, and
they grow back once batches of the smaller size are answered. Against an in-process TF
Serving (fakeserving) that answers with TF Serving's own texts (serving/local/FACTS.md);
events, never sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.core import batchlimit
from gateway.core.batchlimit import IMAGE, LOAD, SIZE, BatchLimit, refusal
from gateway.errors import GatewayError, Kind
from tests.support.coalescing import (
    batches,
    config,
    per_image,
    scores_model,
    start,
    top,
    until,
    waiting,
)
from tests.support.facts import fact, text
from tests.support.fakeserving import FakeServing, Rejected
from tests.support.pipelines import pipeline_for


class Server:
    """TF Serving's answer to a batch: `refuse(count)` gives (code, text) to refuse it with,
    or None to answer it."""

    def __init__(self) -> None:
        self.refuse: Any = lambda count: None

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        refused = self.refuse(len(inputs["input_tensor"]))
        if refused is not None:
            raise Rejected(*refused)
        return per_image(inputs)


async def batch_behind_a_call(pipeline: Any, serving: FakeServing, shades: list[int]) -> list[Any]:
    """One image held in flight, `shades` queued behind it, then all let go: the queued ones
    leave as a batch (or batches of the queue's limit). Returns every result, exceptions too."""
    serving.gate = asyncio.Event()
    first = start(pipeline, 0)
    await until(lambda: serving.in_predict == 1)
    queued = [start(pipeline, k) for k in shades]
    await until(lambda: waiting(pipeline) == len(shades) or serving.in_predict > 1)
    serving.gate.set()
    return list(await asyncio.gather(first, *queued, return_exceptions=True))


def only_batches(code: grpc.StatusCode, message: str) -> Any:
    return lambda count: (code, message) if count > 1 else None


LOAD_REFUSALS = {
    "RESOURCE_EXHAUSTED without a message (gRPC's thread quota)": (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "", Kind.OVERLOADED),
    "TF Serving's full batch queue": (
        grpc.StatusCode.UNAVAILABLE, text("batch_queue_full"), Kind.UNAVAILABLE),
}  # fmt: skip


@pytest.mark.parametrize("case", LOAD_REFUSALS)
def test_a_batch_refused_for_load_is_not_sent_again_and_its_images_are_told_to_retry(
    tmp_path, case: str
) -> None:
    """Three refusals in a row (the afternoon of issue 42): one call per refused batch, no
    split, the batches keep their size; then the load clears and a batch of three goes."""
    code, message, kind = LOAD_REFUSALS[case]
    server = Server()

    async def scenario() -> tuple[list[list[Any]], list[int], int]:
        async with pipeline_for([scores_model(server)], config(tmp_path)) as (pipeline, serving):
            server.refuse = only_batches(code, message)
            rounds = [await batch_behind_a_call(pipeline, serving, [1, 2, 3]) for _ in range(3)]
            server.refuse = lambda count: None
            rounds.append(await batch_behind_a_call(pipeline, serving, [4, 5, 6]))
            [queue] = pipeline._coalescer._queues.values()
            return rounds, batches(serving), queue.limit

    rounds, sizes, limit = asyncio.run(scenario())
    assert sizes == [1, 3] * 4  # each refused batch was one call, and nothing more
    for refused in rounds[:3]:
        assert top(refused[0]) == 0
        for error in refused[1:]:
            assert isinstance(error, GatewayError) and error.kind is kind, error
            assert error.retry_after == batchlimit.RETRY_AFTER
            assert "not sent again" in error.message
    assert [top(o) for o in rounds[3]] == [0, 4, 5, 6]
    assert limit == 4  # load says nothing about a batch's size


def test_a_batch_that_does_not_fit_the_devices_memory_goes_in_halves(tmp_path) -> None:
    code, oom = fact(
        "tensor_oom", shape="[3,224,224,3]", dtype="float", allocator="GPU_0_bfc",
        device="/job:localhost/replica:0/task:0/device:GPU:0",
    )  # fmt: skip
    server = Server()
    server.refuse = lambda count: (getattr(grpc.StatusCode, code), oom) if count > 2 else None

    async def scenario() -> tuple[list[Any], list[int], int]:
        async with pipeline_for([scores_model(server)], config(tmp_path)) as (pipeline, serving):
            results = await batch_behind_a_call(pipeline, serving, [1, 2, 3])
            [queue] = pipeline._coalescer._queues.values()
            return results, batches(serving), queue.limit

    results, sizes, limit = asyncio.run(scenario())
    assert [top(o) for o in results] == [0, 1, 2, 3]
    assert sizes[:2] == [1, 3] and sorted(sizes[2:]) == [1, 2] and limit == 2


def test_smaller_batches_grow_back_once_batches_at_the_limit_are_answered(
    tmp_path, monkeypatch
) -> None:
    """TF Serving takes 2 images per call, then (redeployed) 4: the queue's limit drops to 2
    and doubles back to the model's max_batch of 4 after GROW_AFTER full batches of 2 (here
    4, the refused batch's two halves among them, and no hold, so the test needs no clock)."""
    monkeypatch.setattr(batchlimit, "GROW_AFTER", 4)
    monkeypatch.setattr(batchlimit, "HOLD_MIN", 0.0)
    server = Server()
    ceiling = {"max": 2}
    server.refuse = lambda count: (
        (grpc.StatusCode.INVALID_ARGUMENT, text("batch_too_large", size=count, max=ceiling["max"]))
        if count > ceiling["max"] else None
    )  # fmt: skip

    async def scenario() -> tuple[list[int], list[int], list[Any]]:
        async with pipeline_for([scores_model(server)], config(tmp_path)) as (pipeline, serving):
            limits = []
            await batch_behind_a_call(pipeline, serving, [1, 2, 3, 4])  # 4 refused: halves
            [queue] = pipeline._coalescer._queues.values()
            limits.append(queue.limit)
            ceiling["max"] = 4
            for _ in range(2):
                await batch_behind_a_call(pipeline, serving, [5, 6])  # full batches of 2
                limits.append(queue.limit)
            last = await batch_behind_a_call(pipeline, serving, [1, 2, 3, 4])
            limits.append(queue.limit)
            return limits, batches(serving), last

    limits, sizes, last = asyncio.run(scenario())
    assert limits == [2, 2, 4, 4]
    assert sizes[:2] == [1, 4] and sorted(sizes[2:4]) == [2, 2]
    assert sizes[-2:] == [1, 4]  # one call for four images again
    assert [top(o) for o in last] == [0, 1, 2, 3, 4]


def test_a_refused_size_is_tried_again_only_after_a_hold_that_grows() -> None:
    """A server whose own ceiling is below max_batch: one refused probe per hold (30 s, then
    60 s, ... up to 10 min), not one per batch; an answered probe resets the hold."""
    limit = BatchLimit(8)
    limit.too_large(8, now=0.0)
    assert (limit.limit, limit.hold_until) == (4, 30.0)
    for _ in range(batchlimit.GROW_AFTER * 3):  # full batches of 4 within the hold
        limit.answered(4, now=10.0)
    assert limit.limit == 4
    limit.answered(4, now=31.0)  # the hold is over: a batch of 8 is tried
    assert limit.limit == 8
    limit.too_large(8, now=31.5)  # refused again: the next hold is twice as long
    assert (limit.limit, limit.hold_until) == (4, 91.5)
    limit.too_large(4, now=32.0)  # a half refused within the same hold: no longer hold
    assert (limit.limit, limit.hold_until) == (2, 91.5)
    for _ in range(20):
        limit.too_large(8, now=limit.hold_until)
    assert limit.hold == batchlimit.HOLD_MAX
    # Grown back and answered: the hold starts again from its shortest.
    limit.refused, limit.limit = None, 8
    limit.probing = True
    limit.answered(8, now=1e6)
    assert limit.hold == batchlimit.HOLD_MIN
    assert BatchLimit(8).limit == 8 and BatchLimit(1).limit == 1


def test_refusals_are_told_apart_by_tf_servings_own_texts() -> None:
    def error(kind: Kind, message: str) -> GatewayError:
        return GatewayError(kind, f"TF Serving rejected the request for model m: {message}")

    oom = text("tensor_oom", shape="[8,640,640,3]", dtype="float", device="GPU:0", allocator="a")
    assert refusal(error(Kind.INVALID_INPUT, text("batch_too_large", size=9, max=8))) == SIZE
    assert refusal(error(Kind.OVERLOADED, oom)) == SIZE
    assert refusal(error(Kind.OVERLOADED, "Received message larger than max (9 vs. 4)")) == SIZE
    assert refusal(error(Kind.UNAVAILABLE, text("batch_queue_full"))) == LOAD
    assert refusal(error(Kind.OVERLOADED, "no details")) == LOAD
    assert refusal(error(Kind.INVALID_INPUT, text("wrong_dtype", index=0, signature_dtype="float",
                                                   sent_dtype="int32"))) == IMAGE  # fmt: skip
    assert refusal(error(Kind.BAD_MODEL, "signature")) == "other"
