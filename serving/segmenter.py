"""A deterministic reference instance segmenter with Mask R-CNN's outputs, as the TF Object
Detection API (and Model Garden's normalized-box export) give them.

Input `input_tensor` uint8 [1, -1, -1, 3] (the OD API's image_tensor). Each palette colour
found in the image is one instance (serving.instances.colour_instances):
- `detection_boxes` [1, 100, 4]: the bounding box of all its pixels, normalised
  [ymin, xmin, ymax, xmax] (max exclusive, as the detector's);
- `detection_classes` [1, 100]: its 1-based class id (serving/label_map.pbtxt);
- `detection_scores` [1, 100]: 0.5 + 0.5 x the share of its box its pixels fill (a disc
  scores 0.89, a box 1.0);
- `num_detections` [1]; rows ordered by score (ties: class id), padded with zeros to 100;
- `detection_masks` [1, 100, 33, 33]: box-relative, the colour's mask sampled at the centres
  of the box's 33 x 33 cells (serving.masks.cell_samples), so the gateway pastes the shape
  back: a ring keeps its hole, an L its missing corner.
No weights; every number follows from the pixels (tests/serving/test_task_models.py
computes them in numpy).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from serving.detector import MAX_DETECTIONS, PALETTE_RGB
from serving.instances import colour_instances
from serving.masks import cell_samples

MASK_SIZE = 33  # the OD API Mask R-CNN exports' mask resolution

OUTPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "detection_boxes": (MAX_DETECTIONS, 4),
    "detection_scores": (MAX_DETECTIONS,),
    "detection_classes": (MAX_DETECTIONS,),
    "num_detections": (),
    "detection_masks": (MAX_DETECTIONS, MASK_SIZE, MASK_SIZE),
}


def _pad(x: tf.Tensor) -> tf.Tensor:
    rows = MAX_DETECTIONS - tf.shape(x)[0]
    return tf.pad(x, [[0, rows]] + [[0, 0]] * (len(x.shape) - 1))


def segment_image(image: tf.Tensor, palette: tf.Tensor) -> dict[str, tf.Tensor]:
    """The outputs (no batch dimension) for one [H, W, 3] image."""
    found = colour_instances(image, palette)
    keep = found.keep
    pixel_boxes = tf.gather(found.boxes, keep)
    height, width = tf.shape(found.masks)[1], tf.shape(found.masks)[2]
    size = tf.cast(tf.stack([height, width, height, width]), tf.float32)
    return {
        "detection_boxes": _pad(pixel_boxes / size),
        "detection_scores": _pad(tf.gather(found.scores, keep)),
        "detection_classes": _pad(tf.cast(keep + 1, tf.float32)),
        "num_detections": tf.cast(tf.size(keep), tf.float32),
        "detection_masks": _pad(cell_samples(found.masks, pixel_boxes, keep, MASK_SIZE)),
    }


class InstanceSegmenter(tf.Module):
    """Mask R-CNN as the OD API exports it: `input_tensor` uint8 [1, -1, -1, 3]."""

    def __init__(self, version: int = 1) -> None:
        super().__init__(name="instance_segmenter")
        self.palette = tf.Variable(PALETTE_RGB, trainable=False, name="palette")
        self.model_version = tf.Variable(version, dtype=tf.int64, trainable=False, name="version")

    @tf.function(input_signature=[tf.TensorSpec([1, None, None, 3], tf.uint8, name="input_tensor")])
    def __call__(self, input_tensor: tf.Tensor) -> dict[str, Any]:
        signature = {key: tf.TensorSpec(shape, tf.float32) for key, shape in OUTPUT_SHAPES.items()}
        # The run-time batch (TF Serving checks no shapes), as serving.detector.detect_batch.
        dynamic = tf.reshape(input_tensor, tf.concat([[-1], tf.shape(input_tensor)[1:]], 0))
        result: dict[str, tf.Tensor] = tf.map_fn(
            lambda image: segment_image(image, self.palette), dynamic, fn_output_signature=signature
        )
        for key, value in result.items():
            value.set_shape([1, *OUTPUT_SHAPES[key]])
        return result
