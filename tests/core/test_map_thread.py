"""Where a task's mapping runs: inline on the event loop (a few µs of Python per image), or,
for a task that says its mapping takes milliseconds (`map_in_thread`: masks), in the
pipeline's map threads, so the loop keeps answering other requests meanwhile and a held
mapping never takes the decode threads other requests need."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from gateway import policy
from gateway.api.task import TaskRegistry
from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.models import default_registry
from gateway.tasks.detection import DetectionTask
from gateway.upstream.client import TFServingClient
from tests.support.fakeserving import FakeModel, FakeServing
from tests.support.pipelines import OD_OUTPUTS, detect, od_outputs, png, solid


class Recording(DetectionTask):
    """Detection whose mapping notes the thread it ran on."""

    def __init__(self, in_thread: bool) -> None:
        self.map_in_thread = in_thread
        self.threads: list[int] = []

    def map(self, *args: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().map(*args)


@pytest.mark.parametrize("in_thread", [False, True])
def test_a_task_maps_on_the_loop_or_in_a_thread_as_it_says(in_thread: bool) -> None:
    task = Recording(in_thread)

    async def scenario() -> tuple[int, int]:
        model = FakeModel("fixed", {"input_tensor": (tf.uint8, [1, 64, 64, 3])}, OD_OUTPUTS,
                          od_outputs)  # fmt: skip
        serving = FakeServing({"fixed": model})
        settings = Settings(upstream=await serving.start(), model="fixed")
        client = TFServingClient(settings)
        try:
            with ThreadPoolExecutor(2) as executor:
                models = default_registry("fixed", default_task="detection")
                pipeline = Pipeline(
                    settings,
                    client,
                    models,
                    executor,
                    TaskRegistry([task]),
                    policy.build(settings, models),
                )
                image = png(solid(64, 64, (200, 30, 30)).astype(np.uint8))
                outcome = await pipeline.run(task.name, detect(image, "fixed"))
                assert len(outcome.result.detections) == 1  # mapped all the same
        finally:
            await client.close()
            await serving.stop()
        return threading.get_ident(), task.threads[-1]

    loop_thread, mapped_on = asyncio.run(scenario())
    assert (mapped_on != loop_thread) is in_thread


class Held(DetectionTask):
    """Detection whose mapping runs in a thread and waits there until released."""

    map_in_thread = True

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def map(self, *args: Any) -> Any:
        self.entered.set()
        assert self.release.wait(30)
        return super().map(*args)


def test_heavy_mapping_never_holds_the_decode_threads() -> None:
    """With one decode thread and one map thread, a mapping that holds its thread leaves the
    decode thread free: a plain detection (decoded in a thread) is answered meanwhile."""
    held, plain = Held(), DetectionTask()
    held.name = "held"

    async def scenario() -> None:
        model = FakeModel("fixed", {"input_tensor": (tf.uint8, [1, 64, 64, 3])}, OD_OUTPUTS,
                          od_outputs)  # fmt: skip
        serving = FakeServing({"fixed": model})
        settings = Settings(upstream=await serving.start(), model="fixed", map_threads=1)
        client = TFServingClient(settings)
        try:
            with ThreadPoolExecutor(1) as executor:
                models = default_registry("fixed", default_task="detection")
                tasks = TaskRegistry([plain, held])
                pipeline = Pipeline(
                    settings, client, models, executor, tasks, policy.build(settings, models)
                )
                # A PNG is decoded in a thread (only small plain JPEGs decode inline).
                image = png(solid(64, 64, (200, 30, 30)).astype(np.uint8))
                heavy = asyncio.create_task(pipeline.run("held", detect(image, "fixed")))
                await asyncio.to_thread(held.entered.wait, 30)
                outcome = await asyncio.wait_for(
                    pipeline.run("detection", detect(image, "fixed")), 30
                )
                assert len(outcome.result.detections) == 1
                assert not heavy.done()  # still mapping: the detection did not wait for it
                held.release.set()
                await heavy
                pipeline.close()
        finally:
            held.release.set()
            await client.close()
            await serving.stop()

    asyncio.run(scenario())
