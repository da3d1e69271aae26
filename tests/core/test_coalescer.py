"""Coalescing: the pipeline against an in-process TF Serving (fakeserving) whose Predicts are
held at a gate, so a call is in flight for as long as a test says. Real asyncio and real
gRPC; tests wait for events (a call arriving, a task ending), never for time."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import pytest
import tensorflow as tf

from gateway import metrics
from gateway.domain import Outcome
from gateway.errors import GatewayError, Kind
from tests.support.coalescing import (
    batches,
    config,
    per_image,
    scores_model,
    shade,
    start,
    top,
    until,
    waiting,
)
from tests.support.facts import text
from tests.support.fakeserving import FakeModel, Rejected
from tests.support.pipelines import classify, pipeline_for, png, solid, write_config


def test_an_image_that_finds_the_model_idle_goes_alone_at_once(tmp_path):
    async def scenario() -> tuple[Outcome, list[int]]:
        async with pipeline_for([scores_model()], config(tmp_path)) as (pipeline, serving):
            outcome = await pipeline.run("classification", classify(shade(3), "scores"))
            return outcome, batches(serving)

    outcome, sizes = asyncio.run(scenario())
    assert top(outcome) == 3 and sizes == [1]


def test_images_queued_behind_a_call_go_as_one_batch_and_each_gets_its_own_answer(tmp_path):
    async def scenario() -> tuple[list[Outcome], list[int]]:
        async with pipeline_for([scores_model()], config(tmp_path)) as (pipeline, serving):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            queued = [start(pipeline, k) for k in (5, 2, 7)]
            await until(lambda: waiting(pipeline) == 3)
            serving.gate.set()
            return await asyncio.gather(first, *queued), batches(serving)

    outcomes, sizes = asyncio.run(scenario())
    assert [top(o) for o in outcomes] == [1, 5, 2, 7]
    assert sizes == [1, 3]


def test_a_full_batch_goes_without_waiting_for_the_call_in_flight(tmp_path):
    async def scenario() -> tuple[list[Outcome], list[int]]:
        async with pipeline_for([scores_model()], config(tmp_path, "max_batch = 2")) as (
            pipeline,
            serving,
        ):
            serving.gate = asyncio.Event()
            first = start(pipeline, 0)
            await until(lambda: serving.in_predict == 1)
            pair = [start(pipeline, 4), start(pipeline, 6)]
            await until(lambda: serving.in_predict == 2)  # sent while the first is held
            serving.gate.set()
            return await asyncio.gather(first, *pair), batches(serving)

    outcomes, sizes = asyncio.run(scenario())
    assert [top(o) for o in outcomes] == [0, 4, 6] and sizes == [1, 2]


def test_a_bad_image_fails_alone_and_its_neighbours_are_batched(tmp_path):
    async def scenario() -> tuple[list[Any], list[int]]:
        async with pipeline_for([scores_model()], config(tmp_path)) as (pipeline, serving):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            bad = asyncio.ensure_future(
                pipeline.run("classification", classify(b"\x89PNG broken", "scores"))
            )
            good = [start(pipeline, 3), start(pipeline, 4)]
            await until(lambda: bad.done() and waiting(pipeline) == 2)
            serving.gate.set()
            results = await asyncio.gather(first, bad, *good, return_exceptions=True)
            return results, batches(serving)

    results, sizes = asyncio.run(scenario())
    assert isinstance(results[1], GatewayError) and results[1].kind is Kind.INVALID_INPUT
    assert [top(results[i]) for i in (0, 2, 3)] == [1, 3, 4] and sizes == [1, 2]


def test_a_batch_is_sent_by_its_earliest_deadline_which_fails_only_its_own_image(tmp_path):
    async def scenario() -> tuple[list[Any], list[int]]:
        async with pipeline_for([scores_model()], config(tmp_path)) as (pipeline, serving):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            hurried = start(pipeline, 2, timeout=0.3)
            patient = start(pipeline, 3)
            # Sent before the short deadline, while the first call is still held ...
            await until(lambda: serving.in_predict == 2)
            # ... which then passes for its image alone.
            await until(hurried.done)
            serving.gate.set()
            results = await asyncio.gather(first, hurried, patient, return_exceptions=True)
            return results, batches(serving)

    results, sizes = asyncio.run(scenario())
    assert isinstance(results[1], GatewayError) and results[1].kind is Kind.DEADLINE
    assert top(results[0]) == 1 and top(results[2]) == 3
    assert sizes == [1, 2]


def test_a_cancelled_image_leaves_its_queue_and_the_batch_goes_without_it(tmp_path):
    async def scenario() -> tuple[list[Any], list[int]]:
        async with pipeline_for([scores_model()], config(tmp_path)) as (pipeline, serving):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            queued = [start(pipeline, k) for k in (2, 5, 6)]
            await until(lambda: waiting(pipeline) == 3)
            queued[1].cancel()
            await until(lambda: waiting(pipeline) == 2)
            serving.gate.set()
            results = await asyncio.gather(first, *queued, return_exceptions=True)
            return results, batches(serving)

    results, sizes = asyncio.run(scenario())
    assert isinstance(results[2], asyncio.CancelledError)
    assert [top(results[i]) for i in (0, 1, 3)] == [1, 2, 6] and sizes == [1, 2]


def test_an_image_cancelled_in_flight_does_not_disturb_its_batch(tmp_path):
    async def scenario() -> tuple[list[Any], list[int]]:
        async with pipeline_for([scores_model()], config(tmp_path, "max_batch = 2")) as (
            pipeline,
            serving,
        ):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            pair = [start(pipeline, 3), start(pipeline, 4)]
            await until(lambda: serving.in_predict == 2)
            pair[0].cancel()
            await until(pair[0].done)
            serving.gate.set()
            results = await asyncio.gather(first, *pair, return_exceptions=True)
            return results, batches(serving)

    results, sizes = asyncio.run(scenario())
    assert isinstance(results[1], asyncio.CancelledError)
    assert top(results[0]) == 1 and top(results[2]) == 4 and sizes == [1, 2]


def _split_count(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "vision_gateway_batch_splits_total", {"model": "scores", "reason": reason}
    )
    return value or 0.0


def test_a_batch_refused_as_too_large_is_sent_again_in_halves_and_batches_shrink(tmp_path):
    def at_most_two(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(inputs["input_tensor"])
        if count > 2:  # a batching TF Serving's max_batch_size of 2
            raise Rejected(
                grpc.StatusCode.INVALID_ARGUMENT, text("batch_too_large", size=count, max=2)
            )
        return per_image(inputs)

    before = _split_count("too_large")

    async def scenario() -> tuple[list[Outcome], list[int], int]:
        async with pipeline_for([scores_model(at_most_two)], config(tmp_path)) as (
            pipeline,
            serving,
        ):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            queued = [start(pipeline, k) for k in (2, 3, 4)]
            await until(lambda: waiting(pipeline) == 3)
            serving.gate.set()
            outcomes = await asyncio.gather(first, *queued)
            [queue] = pipeline._coalescer._queues.values()
            return outcomes, batches(serving), queue.limit

    outcomes, sizes, limit = asyncio.run(scenario())
    assert [top(o) for o in outcomes] == [1, 2, 3, 4]
    # Two calls for the refused three (not one per image), and batches of two from now on.
    assert sizes[:2] == [1, 3] and sorted(sizes[2:]) == [1, 2]
    assert limit == 2
    assert _split_count("too_large") == before + 1


def test_an_image_the_model_refuses_fails_alone_after_its_batch_is_split(tmp_path):
    def no_class_five(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        answer = per_image(inputs)
        if (answer["probabilities"].argmax(axis=1) == 5).any():
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, "cannot take class 5")
        return answer

    async def scenario() -> tuple[list[Any], int]:
        async with pipeline_for([scores_model(no_class_five)], config(tmp_path)) as (
            pipeline,
            serving,
        ):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            queued = [start(pipeline, k) for k in (2, 5, 4)]
            await until(lambda: waiting(pipeline) == 3)
            serving.gate.set()
            results = await asyncio.gather(first, *queued, return_exceptions=True)
            [queue] = pipeline._coalescer._queues.values()
            return results, queue.limit

    results, limit = asyncio.run(scenario())
    assert isinstance(results[2], GatewayError) and results[2].kind is Kind.INVALID_INPUT
    assert "cannot take class 5" in results[2].message
    assert [top(results[i]) for i in (0, 1, 3)] == [1, 2, 4]
    assert limit == 4  # the image was the cause, not the batch's size


def test_answers_without_a_batch_dimension_are_fetched_one_image_per_call(tmp_path):
    def first_only(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"probabilities": per_image(inputs)["probabilities"][:1]}

    async def scenario() -> tuple[list[Outcome], list[int]]:
        async with pipeline_for([scores_model(first_only)], config(tmp_path)) as (
            pipeline,
            serving,
        ):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            queued = [start(pipeline, k) for k in (2, 3)]
            await until(lambda: waiting(pipeline) == 2)
            serving.gate.set()
            outcomes = list(await asyncio.gather(first, *queued))
            # From now on the model's images go alone, queued or not.
            serving.gate = asyncio.Event()
            held = start(pipeline, 6)
            await until(lambda: serving.in_predict == 1)
            more = [start(pipeline, 7)]
            await until(lambda: serving.in_predict == 2)
            serving.gate.set()
            outcomes += await asyncio.gather(held, *more)
            return outcomes, batches(serving)

    outcomes, sizes = asyncio.run(scenario())
    assert [top(o) for o in outcomes] == [1, 2, 3, 6, 7]
    assert sizes == [1, 2, 1, 1, 1, 1]


def test_max_delay_lets_an_image_at_an_idle_model_wait_for_company(tmp_path):
    async def scenario() -> tuple[list[Outcome], list[int]]:
        batching = "max_batch = 2\nmax_delay_ms = 1000"
        async with pipeline_for([scores_model()], config(tmp_path, batching)) as (
            pipeline,
            serving,
        ):
            first = start(pipeline, 3)
            await until(lambda: waiting(pipeline) == 1)
            second = start(pipeline, 5)  # fills the batch: both go at once
            return list(await asyncio.gather(first, second)), batches(serving)

    outcomes, sizes = asyncio.run(scenario())
    assert [top(o) for o in outcomes] == [3, 5] and sizes == [2]


def test_encoded_images_are_batched_with_images_of_their_size(tmp_path):
    def labels(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(inputs["string_input"])
        return {
            "label": np.array([b"blue"] * count, object),
            "confidence": np.full(count, 0.75, np.float32),
        }

    vit = FakeModel(
        "vit",
        {"string_input": (tf.string, [-1])},
        {"label": (tf.string, [-1]), "confidence": (tf.float32, [-1])},
        labels,
    )
    path = write_config(
        tmp_path,
        '[models.vit]\ntask = "classification"\nlabels = "labels.txt"\n'
        '[models.vit.input]\nstring_encoding = "base64url"\n',
    )

    async def scenario() -> tuple[list[Outcome], list[int]]:
        async with pipeline_for([vit], path) as (pipeline, serving):
            serving.gate = asyncio.Event()

            def go(width: int) -> asyncio.Task[Outcome]:
                image = png(solid(width, 20, (0, 0, 255)))
                return asyncio.ensure_future(pipeline.run("classification", classify(image, "vit")))

            first = go(30)
            await until(lambda: serving.in_predict == 1)
            same = [go(30), go(30)]
            other = go(50)  # its size's queue is idle: it goes at once
            await until(lambda: serving.in_predict == 2 and waiting(pipeline) == 2)
            serving.gate.set()
            outcomes = list(await asyncio.gather(first, *same, other))
            return outcomes, [len(call.inputs["string_input"]) for call in serving.calls]

    outcomes, sizes = asyncio.run(scenario())
    assert all(o.result.classes[0].label == "blue" for o in outcomes)
    assert sizes == [1, 1, 2]


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ([1, 224, 224, 3], "fixes the batch"),
        ([-1, -1, -1, 3], "set input.pad_to"),
    ],
)
def test_models_that_cannot_batch_send_every_image_alone(tmp_path, shape, reason):
    model = FakeModel(
        "scores",
        {"input_tensor": (tf.float32, shape)},
        {"probabilities": (tf.float32, [-1, 8])},
        per_image,
    )

    async def scenario() -> tuple[list[Outcome], list[int], str]:
        async with pipeline_for([model], config(tmp_path)) as (pipeline, serving):
            serving.gate = asyncio.Event()
            first = start(pipeline, 1)
            await until(lambda: serving.in_predict == 1)
            others = [start(pipeline, 2), start(pipeline, 3)]
            await until(lambda: serving.in_predict == 3)
            serving.gate.set()
            outcomes = list(await asyncio.gather(first, *others))
            [plan] = pipeline._plans.values()
            return outcomes, batches(serving), plan.batch.reason

    outcomes, sizes, why = asyncio.run(scenario())
    assert [top(o) for o in outcomes] == [1, 2, 3] and sizes == [1, 1, 1]
    assert reason in why
