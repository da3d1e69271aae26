"""The coalescer's tests' model and helpers (tests/core/test_coalescer*.py): a classifier on
an in-process TF Serving (fakeserving) that answers each image with its own class, images of
each class, and waits on events (loop iterations), never on time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from gateway.domain import Outcome
from tests.support.fakeserving import FakeModel, FakeServing
from tests.support.pipelines import classify, png, solid, write_config

SCALE = "scale = 0.00392156862745098"


def config(tmp: Path, batching: str = "max_batch = 4", extra: str = "") -> Path:
    return write_config(
        tmp,
        f'[models.scores]\ntask = "classification"\nlabels = "labels.txt"\n'
        f"[models.scores.input]\n{SCALE}\n[models.scores.batching]\n{batching}\n{extra}",
    )


def shade(k: int) -> bytes:
    """An image the model below classifies as class k (its red level is k/7)."""
    return png(solid(40 + k, 30, (round(255 * k / 7), 0, 0)))


def per_image(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each image's class: its mean red level x 7, at 0.9."""
    images = inputs["input_tensor"]
    classes = np.rint(images[..., 0].mean(axis=(1, 2)) * 7).astype(int)
    probs = np.full((len(images), 8), 0.1 / 7, np.float32)
    probs[np.arange(len(images)), classes] = 0.9
    return {"probabilities": probs}


def scores_model(compute: Callable[[Any], dict[str, np.ndarray]] = per_image) -> FakeModel:
    return FakeModel(
        "scores",
        {"input_tensor": (tf.float32, [-1, 224, 224, 3])},
        {"probabilities": (tf.float32, [-1, 8])},
        compute,
    )


async def until(condition: Callable[[], bool]) -> None:
    """Lets the event loop run until `condition` holds (no sleeping: loop iterations)."""
    for _ in range(500_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def waiting(pipeline: Any) -> int:
    return sum(len(q.waiting) for q in pipeline._coalescer._queues.values())


def top(outcome: Outcome) -> int:
    return outcome.result.classes[0].class_id


def batches(serving: FakeServing) -> list[int]:
    return [len(call.inputs["input_tensor"]) for call in serving.calls]


def start(pipeline: Any, k: int, **kwargs: Any) -> asyncio.Task[Outcome]:
    request = classify(shade(k), "scores")._replace(**kwargs)
    return asyncio.ensure_future(pipeline.run("classification", request))
