"""Keypoint models for the tests, exported with TensorFlow, and pictures whose truth they know.

The models find the image's red rectangle and put COCO-17's keypoints on its diagonal: point
k at (x_min + k/16 (x_max - x_min), y_min + k/16 (y_max - y_min)) in pixels of what they
received, with score 0.5 + k/40. `pose_yolo` gives a YOLOv8-pose raw head [b, 56, 2] (the
rectangle, and a copy 1 px aside that NMS removes), `pose_od` OD API-style detection_keypoints
(normalized y, x) with its boxes. Used by tests/e2e/test_keypoints.py and the page's tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gateway.tasks.keypoints.names import COCO17_NAMES
from tests.support.pictures import stored_as_shown

RED = (220, 20, 30)
MODEL_CONFIG = """\
[models.pose_yolo]
task = "keypoints"
[models.pose_yolo.outputs]
decoder = "yolo-pose"

[models.pose_letterboxed]
task = "keypoints"
[models.pose_letterboxed.input]
pad_to = [128, 128]
[models.pose_letterboxed.outputs]
decoder = "yolo-pose"

[models.pose_od]
task = "keypoints"
"""


def _red_rectangle(images: Any) -> tuple[Any, ...]:
    """Edges (x_min, y_min, x_max, y_max; max exclusive) of the red pixels, and whether any."""
    import tensorflow as tf

    x = tf.cast(images, tf.float32)
    red = (x[..., 0] > 150) & (x[..., 1] < 100) & (x[..., 2] < 100)
    height, width = tf.shape(x)[1], tf.shape(x)[2]
    ys = tf.cast(tf.range(height), tf.float32)[None, :, None] + tf.zeros_like(x[..., 0])
    xs = tf.cast(tf.range(width), tf.float32)[None, None, :] + tf.zeros_like(x[..., 0])
    big = 1e9
    x_min = tf.reduce_min(tf.where(red, xs, big), axis=[1, 2])
    x_max = tf.reduce_max(tf.where(red, xs, -big), axis=[1, 2]) + 1
    y_min = tf.reduce_min(tf.where(red, ys, big), axis=[1, 2])
    y_max = tf.reduce_max(tf.where(red, ys, -big), axis=[1, 2]) + 1
    return x_min, y_min, x_max, y_max, tf.reduce_any(red, axis=[1, 2])


def export_models(root: Path) -> None:
    import tensorflow as tf

    steps = tf.range(17, dtype=tf.float32) / 16
    point_scores = 0.5 + tf.range(17, dtype=tf.float32) / 40

    def diagonal(x_min: Any, y_min: Any, x_max: Any, y_max: Any) -> tuple[Any, Any]:
        kx = x_min[:, None] + (x_max - x_min)[:, None] * steps
        ky = y_min[:, None] + (y_max - y_min)[:, None] * steps
        return kx, ky

    class Yolo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)])
        def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            x_min, y_min, x_max, y_max, found = _red_rectangle(images)
            kx, ky = diagonal(x_min, y_min, x_max, y_max)
            visibility = tf.zeros_like(kx) + point_scores
            points = tf.reshape(tf.stack([kx, ky, visibility], axis=-1), (-1, 51))
            score = tf.where(found, 0.9, 0.0)[:, None]
            box = tf.stack([(x_min + x_max) / 2, (y_min + y_max) / 2, x_max - x_min,
                            y_max - y_min], axis=1)  # fmt: skip
            first = tf.concat([box, score, points], axis=1)
            aside = tf.concat([box + tf.constant([1.0, 0.0, 0.0, 0.0]), score - 0.1, points], 1)
            return {"output0": tf.stack([first, aside], axis=2)}

    class OdApi(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, None, None, 3], tf.uint8)])
        def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            x_min, y_min, x_max, y_max, found = _red_rectangle(images)
            height = tf.cast(tf.shape(images)[1], tf.float32)
            width = tf.cast(tf.shape(images)[2], tf.float32)
            kx, ky = diagonal(x_min, y_min, x_max, y_max)
            box = tf.stack([y_min / height, x_min / width, y_max / height, x_max / width], 1)
            points = tf.stack([ky / height, kx / width], axis=-1)  # [1, 17, 2]
            return {
                "detection_boxes": tf.stack([box, tf.zeros_like(box)], axis=1),
                "detection_scores": tf.stack([tf.where(found, 0.9, 0.0), [0.0]], axis=1),
                "detection_classes": tf.constant([[1.0, 0.0]]),
                "num_detections": tf.constant([1.0]),
                "detection_keypoints": tf.stack([points, tf.zeros_like(points)], axis=1),
                "detection_keypoint_scores": tf.stack(
                    [tf.zeros_like(kx) + point_scores, tf.zeros_like(kx)], axis=1
                ),
            }

    for name, module in (("pose_yolo", Yolo()), ("pose_od", OdApi())):
        tf.saved_model.save(
            module, str(root / name / "1"), signatures={"serving_default": module.serve}
        )


def picture(width: int, height: int, box: tuple[int, int, int, int], fmt: str = "PNG",
            orientation: int = 1) -> bytes:  # fmt: skip
    """A grey-green picture with a red rectangle at `box` (x_min, y_min, x_max, y_max) as a
    viewer shows it; an EXIF orientation stores the pixels turned so a viewer shows that."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[...] = (90, 140, 100)
    x0, y0, x1, y1 = box
    pixels[y0:y1, x0:x1] = RED
    return stored_as_shown(pixels, fmt, orientation)


def expected(box: tuple[int, int, int, int]) -> list[tuple[str, float, float, float]]:
    x0, y0, x1, y1 = box
    return [
        (name, x0 + (x1 - x0) * k / 16, y0 + (y1 - y0) * k / 16, 0.5 + k / 40)
        for k, name in enumerate(COCO17_NAMES)
    ]
