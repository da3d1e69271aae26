"""The reference segmenter's and keypoint model's instances: one per palette colour present.

The pixels of each colour of serving.scenes.PALETTE are found as the reference detector finds
them (serving.detector.class_masks: nearest palette colour within its threshold, opened and
closed 3 x 3), and all the pixels of one colour make one instance, whatever their shape: its
box is their bounding box and its score 0.5 + 0.5 x the share of the box they fill. A picture
with each colour once (tools/devrun.py's shapes.jpg) gives one instance per shape. Cheap
(no search for rectangles), and numpy computes the same from the pixels.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from serving.detector import class_masks

_FAR = 1e9


class Instances(NamedTuple):
    masks: tf.Tensor  # float32 [K, H, W]: 1 where the pixel is of colour k
    boxes: tf.Tensor  # float32 [K, 4]: pixel edges y0, x0, y1, x1 (max exclusive)
    scores: tf.Tensor  # float32 [K]: 0 for a colour not present
    keep: tf.Tensor  # int32 [n]: the present colours' indices, best score first


def colour_instances(image: tf.Tensor, palette: tf.Tensor) -> Instances:
    """The instances of one [H, W, 3] image (uint8, or float32 with values 0..255)."""
    masks = tf.transpose(tf.cast(class_masks(image, palette), tf.float32), [2, 0, 1])
    height, width = tf.shape(masks)[1], tf.shape(masks)[2]
    ys = tf.cast(tf.range(height), tf.float32)[tf.newaxis, :, tf.newaxis]
    xs = tf.cast(tf.range(width), tf.float32)[tf.newaxis, tf.newaxis, :]
    found = masks > 0
    y0 = tf.reduce_min(tf.where(found, ys, _FAR), axis=[1, 2])
    y1 = tf.reduce_max(tf.where(found, ys, -_FAR), axis=[1, 2]) + 1
    x0 = tf.reduce_min(tf.where(found, xs, _FAR), axis=[1, 2])
    x1 = tf.reduce_max(tf.where(found, xs, -_FAR), axis=[1, 2]) + 1
    present = tf.reduce_any(found, axis=[1, 2])
    boxes = tf.where(present[:, tf.newaxis], tf.stack([y0, x0, y1, x1], axis=1), 0.0)
    area = tf.where(present, (y1 - y0) * (x1 - x0), 1.0)
    scores = tf.where(present, 0.5 + 0.5 * tf.reduce_sum(masks, axis=[1, 2]) / area, 0.0)
    # Present colours by score (stable: ties keep class order); absent ones score 0.
    order = tf.argsort(scores, direction="DESCENDING", stable=True)
    keep = order[: tf.reduce_sum(tf.cast(present, tf.int32))]
    return Instances(masks, boxes, scores, keep)
