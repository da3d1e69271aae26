"""Box-relative instance masks as a Mask R-CNN mask head answers them, in TensorFlow ops.

Mask R-CNN (the OD API's and Model Garden's exports) gives each detection a small grid,
`detection_masks` [N, m, m], covering its box: cell (i, j) is the mask's value at the centre
of the box's cell (i, j). `cell_samples` computes that grid from a per-pixel mask by bilinear
sampling at the cells' centres, so a model built from TensorFlow ops can answer exact,
known masks (serving.segmenter; the segmentation tests' models).
"""

from __future__ import annotations

import tensorflow as tf


def cell_samples(
    masks: tf.Tensor, boxes: tf.Tensor, box_indices: tf.Tensor, cells: int
) -> tf.Tensor:
    """float32 [N, cells, cells]: for each box (pixel edges y0, x0, y1, x1, max exclusive,
    of image box_indices[n] of `masks`, float32 [B, H, W]), the mask bilinearly sampled at
    the centres of the box's cells x cells equal cells (pixel (r, c) covers [r, r + 1) x
    [c, c + 1), its value sits at its centre; outside the image counts 0)."""
    height = tf.cast(tf.shape(masks)[1], tf.float32)
    width = tf.cast(tf.shape(masks)[2], tf.float32)
    y0, x0, y1, x1 = tf.unstack(tf.cast(boxes, tf.float32), num=4, axis=1)
    half_h, half_w = (y1 - y0) / cells / 2, (x1 - x0) / cells / 2
    # crop_and_resize samples at corner-aligned positions of normalised (size - 1)
    # coordinates, in pixel-centre units: the first and last cells' centres, shifted by 0.5.
    span_h, span_w = tf.maximum(height - 1, 1.0), tf.maximum(width - 1, 1.0)
    crop = tf.stack(
        [
            (y0 + half_h - 0.5) / span_h,
            (x0 + half_w - 0.5) / span_w,
            (y1 - half_h - 0.5) / span_h,
            (x1 - half_w - 0.5) / span_w,
        ],
        axis=1,
    )
    grid = tf.image.crop_and_resize(
        tf.cast(masks, tf.float32)[..., tf.newaxis], crop, box_indices, [cells, cells]
    )
    return grid[..., 0]
