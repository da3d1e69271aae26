"""A deterministic reference image embedder, as a Keras application exported without its
classifier (include_top=False, pooling="avg") gives one.

Input `inputs` float32 [-1, 224, 224, 3], RGB in [0, 1] (the gateway resizes and scales:
serving/gateway-models.toml); output `output_0` float32 [-1, 48]: the picture as a 4 x 4
thumbnail, each cell's mean colour minus 0.5 (row by row, then R, G, B), so pictures alike
in layout and colour lie close together. The gateway divides it by its L2 norm. No weights;
numpy computes it from the input (tests/serving/test_task_models.py).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from serving.shapes import checked_input

IMAGE_SIZE = 224
GRID = 4
DIMENSION = GRID * GRID * 3


class Embedder(tf.Module):
    """`inputs` float32 [-1, 224, 224, 3] in [0, 1] -> `output_0` float32 [-1, 48]."""

    def __init__(self, version: int = 1) -> None:
        super().__init__(name="embedder")
        self.model_version = tf.Variable(version, dtype=tf.int64, trainable=False, name="version")

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, IMAGE_SIZE, IMAGE_SIZE, 3], tf.float32, name="inputs")
        ]
    )
    def __call__(self, inputs: tf.Tensor) -> dict[str, Any]:
        x = checked_input(inputs, "inputs", (None, IMAGE_SIZE, IMAGE_SIZE, 3))
        cell = IMAGE_SIZE // GRID
        pooled = tf.nn.avg_pool2d(x, cell, cell, "VALID")  # [B, 4, 4, 3]
        return {"output_0": tf.reshape(pooled - 0.5, [-1, DIMENSION])}
