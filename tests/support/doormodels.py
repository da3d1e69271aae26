"""Two models of an in-process TF Serving (tests/support/fakeserving.py) and the model config
that serves them, for tests of the doors and the client over tests/support/doors.py: `detector`
(OD API outputs: one box over the centre half of the image, class 1, "a box") and `colours` (a
classifier: each channel's share of the image's mean colour, labels red, green, blue), and
pipelines of them (PIPELINES, given to write_model_config)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from tests.support.fakeserving import Arrays, FakeModel

COLOURS = ("red", "green", "blue")
MODEL_CONFIG = """\
[defaults]
detection = "detector"
classification = "colours"

[models.detector]
task = "detection"
label_map = "label_map.pbtxt"

[models.colours]
task = "classification"
labels = "colours.txt"
top_k = 3
"""
# Pipelines over them (docs/pipelines.md), for the client's tests: each box's colour, and a
# step whose model TF Serving lacks (each crop then fails on its own: NOT_FOUND).
PIPELINES = """
[pipelines.box_colours]
detect = "detector"
[[pipelines.box_colours.steps]]
name = "colour"
model = "colours"
top_k = 2
[[pipelines.box_colours.steps]]
name = "missing"
model = "no_such_model"
"""


def centre_box(inputs: Arrays) -> dict[str, np.ndarray]:
    boxes = np.zeros((1, 4, 4), np.float32)
    boxes[0, 0] = [0.25, 0.25, 0.75, 0.75]
    return {
        "detection_boxes": boxes,
        "detection_scores": np.array([[0.9, 0, 0, 0]], np.float32),
        "detection_classes": np.array([[1, 0, 0, 0]], np.float32),
        "num_detections": np.array([1], np.float32),
    }


def colour_shares(inputs: Arrays) -> dict[str, np.ndarray]:
    means = inputs["input_tensor"].astype(np.float64).mean(axis=(1, 2)) + 1e-3
    return {"probabilities": (means / means.sum(axis=1, keepdims=True)).astype(np.float32)}


def models() -> list[FakeModel]:
    pixels = {"input_tensor": (tf.uint8, [1, -1, -1, 3])}
    od = {
        "detection_boxes": (tf.float32, [1, -1, 4]),
        "detection_scores": (tf.float32, [1, -1]),
        "detection_classes": (tf.float32, [1, -1]),
        "num_detections": (tf.float32, [1]),
    }
    return [
        FakeModel("detector", pixels, od, centre_box),
        FakeModel("colours", pixels, {"probabilities": (tf.float32, [1, 3])}, colour_shares),
    ]


def write_model_config(directory: Path, pipelines: str = "") -> Path:
    (directory / "label_map.pbtxt").write_text("item { id: 1 name: 'box' display_name: 'a box' }\n")
    (directory / "colours.txt").write_text("\n".join(COLOURS) + "\n")
    path = directory / "models.toml"
    path.write_text(MODEL_CONFIG + pipelines)
    return path
