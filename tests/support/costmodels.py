"""Models of an in-process TF Serving (tests/support/fakeserving.py) that make a request's work
as large as a caller can: `segmenter`, a Mask R-CNN-layout model (OD API outputs plus
box-relative detection_masks [1, N, 28, 28]) that finds `instances` whole-image instances in
any picture (masks of noise, so their outlines are long), taking encoded images (nothing is
decoded in the gateway: the work is the masks'); `boxes`, a detector that gives `count` boxes,
the same on every call (for shadow comparisons); and the model config serving them."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

from tests.support.fakeserving import Arrays, FakeModel

ENCODED = {"encoded_image_string_tensor": (tf.string, [-1])}
OD = {
    "detection_boxes": (tf.float32, [1, -1, 4]),
    "detection_scores": (tf.float32, [1, -1]),
    "detection_classes": (tf.float32, [1, -1]),
    "num_detections": (tf.float32, [1]),
}
MODEL_CONFIG = """\
[defaults]
instance_segmentation = "segmenter"
detection = "boxes"

[models.segmenter]
task = "instance_segmentation"
max_detections = 100
{segmenter}

[models.boxes]
task = "detection"
min_score = 0.01
{boxes}
"""


def segmenter(instances: int = 100, name: str = "segmenter") -> FakeModel:
    masks = np.random.default_rng(42).random((1, instances, 28, 28)).astype(np.float32)

    def compute(inputs: Arrays) -> dict[str, np.ndarray]:
        boxes = np.tile(np.array([0.0, 0.0, 1.0, 1.0], np.float32), (1, instances, 1))
        return {
            "detection_boxes": boxes,
            "detection_scores": np.linspace(0.99, 0.5, instances, dtype=np.float32)[None],
            "detection_classes": np.ones((1, instances), np.float32),
            "num_detections": np.array([instances], np.float32),
            "detection_masks": masks,
        }

    outputs = {**OD, "detection_masks": (tf.float32, [1, -1, 28, 28])}
    return FakeModel(name, ENCODED, outputs, compute)


def boxes(count: int = 1000, name: str = "boxes", version: int = 1) -> FakeModel:
    corners = np.random.default_rng(7).random((count, 2)).astype(np.float32) * 0.9
    found = np.concatenate([corners, corners + 0.1], axis=1)[None]

    def compute(inputs: Arrays) -> dict[str, np.ndarray]:
        return {
            "detection_boxes": found,
            "detection_scores": np.full((1, count), 0.9, np.float32),
            "detection_classes": np.ones((1, count), np.float32),
            "num_detections": np.array([count], np.float32),
        }

    return FakeModel(name, ENCODED, OD, compute, version)


def write_model_config(directory: Path, segmenter: str = "", boxes: str = "") -> Path:
    """The config serving both; `segmenter` and `boxes` are lines added to their tables (e.g.
    a [models.segmenter.limits] table)."""
    path = directory / "models.toml"
    path.write_text(MODEL_CONFIG.format(segmenter=segmenter, boxes=boxes))
    return path


def png(width: int, height: int) -> bytes:
    """A plain grey PNG of the size: a few KB for any size (4000x3000: ~40 KB)."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (120, 120, 120)).save(out, format="PNG")
    return out.getvalue()
