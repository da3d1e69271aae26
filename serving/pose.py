"""A deterministic reference keypoint model with the YOLOv8-pose raw head, as Ultralytics
exports it for TensorFlow (format=saved_model).

Input `images` float32 [1, 640, 640, 3], RGB in [0, 1] (the gateway letterboxes and scales:
serving/gateway-models.toml). Each palette colour in the picture (on the pixels x 255) is a
person (serving.instances.colour_instances, as the reference segmenter's): the output
`output_0` [1, 56, 100] holds one candidate per column, as YOLOv8-pose's [batch, 4 + 1 +
3 x 17, candidates]: the box's centre, width and height in input pixels, the person score,
then COCO-17's keypoints (x, y, visibility) on a stick figure standing in the box: keypoint
k at (x0 + FIGURE[k][0] x width, y0 + FIGURE[k][1] x height), visibility the person score.
The other columns are zeros (score 0); the gateway's `yolo-pose` decoder filters them. No
weights; numpy computes every number from the pixels (tests/serving).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from serving.detector import PALETTE_RGB
from serving.instances import colour_instances
from serving.shapes import checked_input

INPUT_SIZE = 640  # Ultralytics' default imgsz
# COCO-17 in order (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles; each
# pair left then right): (x, y) as shares of the box, the person facing the viewer.
FIGURE: tuple[tuple[float, float], ...] = (
    (0.50, 0.08),
    (0.56, 0.05),
    (0.44, 0.05),
    (0.62, 0.07),
    (0.38, 0.07),
    (0.70, 0.24),
    (0.30, 0.24),
    (0.82, 0.40),
    (0.18, 0.40),
    (0.90, 0.56),
    (0.10, 0.56),
    (0.64, 0.56),
    (0.36, 0.56),
    (0.66, 0.76),
    (0.34, 0.76),
    (0.68, 0.96),
    (0.32, 0.96),
)
CHANNELS = 4 + 1 + 3 * len(FIGURE)
CANDIDATES = 100


def pose_head(boxes: tf.Tensor, scores: tf.Tensor) -> tf.Tensor:
    """The raw head [B, 56, N] for pixel boxes [B, N, 4] (y0, x0, y1, x1) and scores [B, N]."""
    y0, x0, y1, x1 = tf.unstack(boxes, num=4, axis=-1)
    width, height = x1 - x0, y1 - y0
    figure = tf.constant(FIGURE, tf.float32)
    kx = x0[..., tf.newaxis] + width[..., tf.newaxis] * figure[:, 0]  # [B, N, 17]
    ky = y0[..., tf.newaxis] + height[..., tf.newaxis] * figure[:, 1]
    visibility = tf.zeros_like(kx) + scores[..., tf.newaxis]
    points = tf.reshape(
        tf.stack([kx, ky, visibility], axis=-1), tf.concat([tf.shape(kx)[:2], [-1]], 0)
    )
    centre = tf.stack([(x0 + x1) / 2, (y0 + y1) / 2, width, height, scores], axis=-1)
    return tf.transpose(tf.concat([centre, points], axis=-1), [0, 2, 1])


class PoseModel(tf.Module):
    """YOLOv8-pose as exported for TensorFlow: `images` float32 [1, 640, 640, 3] in [0, 1]."""

    SHAPE = (1, INPUT_SIZE, INPUT_SIZE, 3)

    def __init__(self, version: int = 1) -> None:
        super().__init__(name="pose_model")
        self.palette = tf.Variable(PALETTE_RGB, trainable=False, name="palette")
        self.model_version = tf.Variable(version, dtype=tf.int64, trainable=False, name="version")

    @tf.function(input_signature=[tf.TensorSpec(SHAPE, tf.float32, name="images")])
    def __call__(self, images: tf.Tensor) -> dict[str, Any]:
        x = checked_input(images, "images", (None, INPUT_SIZE, INPUT_SIZE, 3))
        pixels = tf.round(x * 255.0)
        # Over the run-time batch, not the declared one (see serving.detector.detect_batch).
        dynamic = tf.reshape(pixels, tf.concat([[-1], tf.shape(pixels)[1:]], axis=0))
        head = tf.map_fn(
            lambda i: self._candidates(dynamic[i]),
            tf.range(tf.shape(dynamic)[0]),
            fn_output_signature=tf.TensorSpec([CHANNELS, CANDIDATES], tf.float32),
        )
        head.set_shape([1, CHANNELS, CANDIDATES])
        return {"output_0": head}

    def _candidates(self, image: tf.Tensor) -> tf.Tensor:
        found = colour_instances(image, self.palette)
        boxes = tf.gather(found.boxes, found.keep)
        scores = tf.gather(found.scores, found.keep)
        head = pose_head(boxes[tf.newaxis], scores[tf.newaxis])[0]  # [56, n]
        return tf.pad(head, [[0, 0], [0, CANDIDATES - tf.shape(head)[1]]])
