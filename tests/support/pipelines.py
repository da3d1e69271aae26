"""The pipeline in-process for its tests (tests/core): a Pipeline over a model config written
here and a TF Serving built from the official protos (tests/support/fakeserving.py), requests to
classify and detect, the images they send, and the fake models' outputs (classifiers with
probabilities, logits or label and confidence; an OD API detector).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from PIL import Image

from gateway import policy
from gateway.app import built_in_tasks
from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.domain import ModelRef, Request
from gateway.models import ModelRegistry, default_registry, load_registry
from gateway.tasks.classification.nouns import ClassifyOptions
from gateway.tasks.detection.nouns import DetectOptions
from gateway.upstream.client import TFServingClient
from tests.support.fakeserving import FakeModel, FakeServing

LABELS = ["red", "green", "blue", "yellow", "cyan", "magenta", "white", "black"]


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def solid(width: int, height: int, rgb: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, np.uint8), (height, width, 3)).copy()


def probabilities(values: list[float]) -> Callable[[Any], dict[str, np.ndarray]]:
    return lambda inputs: {"probabilities": np.array([values], np.float32)}


def od_outputs(inputs: Any) -> dict[str, np.ndarray]:
    """One box at the centre half of the image, class 1, score 0.9."""
    boxes = np.zeros((1, 4, 4), np.float32)
    boxes[0, 0] = [0.25, 0.25, 0.75, 0.75]
    scores = np.array([[0.9, 0, 0, 0]], np.float32)
    return {
        "detection_boxes": boxes,
        "detection_scores": scores,
        "detection_classes": np.array([[1, 0, 0, 0]], np.float32),
        "num_detections": np.array([1], np.float32),
    }


OD_OUTPUTS = {
    "detection_boxes": (tf.float32, [1, -1, 4]),
    "detection_scores": (tf.float32, [1, -1]),
    "detection_classes": (tf.float32, [1, -1]),
    "num_detections": (tf.float32, [1]),
}


def write_config(tmp: Path, text: str) -> Path:
    (tmp / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (tmp / "label_map.pbtxt").write_text("item { id: 1 name: 'red_box' }\n")
    path = tmp / "models.toml"
    path.write_text(text)
    return path


@asynccontextmanager
async def pipeline_for(
    models: list[FakeModel], config: Path | None = None, **settings: Any
) -> AsyncIterator[tuple[Pipeline, FakeServing]]:
    serving = FakeServing({m.name: m for m in models})
    target = await serving.start()
    s = Settings(upstream=target, upstream_retry_backoff=0.001, **settings)
    tasks = built_in_tasks()
    registry: ModelRegistry = (
        load_registry(config, s.model, tasks=tasks.config_readers)
        if config is not None
        else default_registry(s.model, default_task=tasks.default)
    )
    client = TFServingClient(s)
    with ThreadPoolExecutor(2) as executor:
        try:
            yield Pipeline(s, client, registry, executor, tasks, policy.build(s, registry)), serving
        finally:
            await client.close()
            await serving.stop()


def classify(image: bytes, model: str = "", **options: Any) -> Request:
    return Request(image, ModelRef(model), ClassifyOptions(**options), method="test")


def detect(image: bytes, model: str = "", **options: Any) -> Request:
    return Request(image, ModelRef(model), DetectOptions(**options), method="test")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


CLASSIFIER_CONFIG = """
[defaults]
classification = "scores"

[models.scores]
task = "classification"
labels = "labels.txt"
top_k = 3
[models.scores.input]
scale = 0.00392156862745098

[models.logits]
task = "classification"
labels = "labels.txt"
[models.logits.input]
scale = 0.00392156862745098
mean = [0.5, 0.5, 0.5]
std = [0.5, 0.5, 0.5]
layout = "NCHW"

[models.vit]
task = "classification"
labels = "labels.txt"
[models.vit.input]
string_encoding = "base64url"

[models.fixed]
task = "detection"
label_map = "label_map.pbtxt"
"""


def classifier_models() -> list[FakeModel]:
    probs = [0.05, 0.1, 0.6, 0.2, 0.05, 0.0, 0.0, 0.0]
    return [
        FakeModel(
            "scores",
            {"input_tensor": (tf.float32, [-1, 224, 224, 3])},
            {"probabilities": (tf.float32, [-1, 8])},
            probabilities(probs),
        ),
        FakeModel(
            "logits",
            {"pixel_values": (tf.float32, [-1, 3, 224, 224])},
            {"logits": (tf.float32, [-1, 8])},
            lambda inputs: {"logits": np.log(np.array([probs], np.float32) + 1e-9)},
        ),
        FakeModel(
            "vit",
            {"string_input": (tf.string, [-1])},
            {"label": (tf.string, [-1]), "confidence": (tf.float32, [-1])},
            lambda inputs: {
                "label": np.array([b"blue"], object),
                "confidence": np.array([0.75], np.float32),
            },
        ),
        FakeModel(
            "fixed",
            {"input_tensor": (tf.uint8, [1, 320, 320, 3])},
            OD_OUTPUTS,
            od_outputs,
        ),
    ]
