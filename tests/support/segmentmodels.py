"""Segmentation test models exported with TensorFlow (Mask R-CNN-style box-relative masks; a
YOLO-seg-style head and prototypes) that find a red L in a picture, the model config serving
them, the pictures whose truth is known (through EXIF orientation), and the check of one
answered instance against that truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support import masks
from tests.support.pictures import stored_as_shown

RED = (220, 20, 30)


CELLS = 32


MODEL_CONFIG = """\
[models.masks]
task = "instance_segmentation"
labels = "labels.txt"

[models.masks_letterboxed]
task = "instance_segmentation"
[models.masks_letterboxed.input]
pad_to = [160, 160]
[models.masks_letterboxed.outputs]
mask_threshold = 0.4

[models.masks_yolo]
task = "instance_segmentation"
[models.masks_yolo.outputs]
decoder = "yolo-seg"
"""


def export_model(path: Path) -> None:
    import tensorflow as tf

    from serving.masks import cell_samples

    class MaskModel(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)])
        def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.cast(images, tf.float32)
            red = tf.cast((x[..., 0] > 150) & (x[..., 1] < 100) & (x[..., 2] < 100), tf.float32)
            batch, height, width = tf.shape(x)[0], tf.shape(x)[1], tf.shape(x)[2]
            h, w = tf.cast(height, tf.float32), tf.cast(width, tf.float32)
            ys = tf.cast(tf.range(height), tf.float32)[None, :, None] + tf.zeros_like(red)
            xs = tf.cast(tf.range(width), tf.float32)[None, None, :] + tf.zeros_like(red)
            found = red > 0
            x0 = tf.reduce_min(tf.where(found, xs, 1e9), axis=[1, 2])
            x1 = tf.reduce_max(tf.where(found, xs, -1e9), axis=[1, 2]) + 1
            y0 = tf.reduce_min(tf.where(found, ys, 1e9), axis=[1, 2])
            y1 = tf.reduce_max(tf.where(found, ys, -1e9), axis=[1, 2]) + 1
            box = tf.stack([y0 / h, x0 / w, y1 / h, x1 / w], axis=1)
            # The red share at the centres of the box's cells, as Mask R-CNN answers masks.
            pixel_box = tf.stack([y0, x0, y1, x1], axis=1)
            grid = cell_samples(red, pixel_box, tf.range(batch), CELLS)
            score = tf.where(tf.reduce_any(found, axis=[1, 2]), 0.9, 0.0)
            return {
                "detection_boxes": tf.stack([box, tf.zeros_like(box)], axis=1),
                "detection_scores": tf.stack([score, tf.zeros_like(score)], axis=1),
                "detection_classes": tf.ones([batch, 2]),
                "num_detections": tf.ones([batch]),
                "detection_masks": tf.stack([grid, tf.zeros_like(grid)], axis=1),
            }

    class YoloSeg(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)])
        def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.cast(images, tf.float32)
            red = tf.cast((x[..., 0] > 150) & (x[..., 1] < 100) & (x[..., 2] < 100), tf.float32)
            height, width = tf.shape(x)[1], tf.shape(x)[2]
            ys = tf.cast(tf.range(height), tf.float32)[None, :, None] + tf.zeros_like(red)
            xs = tf.cast(tf.range(width), tf.float32)[None, None, :] + tf.zeros_like(red)
            found = red > 0
            x0 = tf.reduce_min(tf.where(found, xs, 1e9), axis=[1, 2])
            x1 = tf.reduce_max(tf.where(found, xs, -1e9), axis=[1, 2]) + 1
            y0 = tf.reduce_min(tf.where(found, ys, 1e9), axis=[1, 2])
            y1 = tf.reduce_max(tf.where(found, ys, -1e9), axis=[1, 2]) + 1
            box = tf.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], axis=1)
            score = tf.where(tf.reduce_any(found, axis=[1, 2]), 0.9, 0.0)[:, None]
            one = tf.ones_like(score)
            first = tf.concat([box, score, one], axis=1)
            aside = tf.concat([box + tf.constant([1.0, 0.0, 0.0, 0.0]), score - 0.1, one], 1)
            share = tf.nn.avg_pool2d(red[..., None], 4, 4, "VALID")  # [b, h/4, w/4, 1]
            logits = (share - 0.5) * 16.0
            return {
                "output0": tf.stack([first, aside], axis=2),
                "output1": tf.transpose(logits, [0, 3, 1, 2]),
            }

    for name, module in (("masks", MaskModel()), ("masks_yolo", YoloSeg())):
        tf.saved_model.save(
            module, str(path / name / "1"), signatures={"serving_default": module.serve}
        )


def shape(width: int, height: int, box: tuple[int, int, int, int]) -> np.ndarray:
    """[h, w] bool: an L filling `box` (x_min, y_min, x_max, y_max) but its top-right
    quarter, as a viewer shows the picture."""
    truth = np.zeros((height, width), bool)
    x0, y0, x1, y1 = box
    truth[y0:y1, x0:x1] = True
    truth[y0 : (y0 + y1) // 2, (x0 + x1) // 2 : x1] = False
    return truth


def picture(truth: np.ndarray, fmt: str = "PNG", orientation: int = 1) -> bytes:
    """Grey-green with the red `truth`; an EXIF orientation stores the pixels turned so that
    a viewer shows that."""
    pixels = np.zeros((*truth.shape, 3), np.uint8)
    pixels[...] = (90, 140, 100)
    pixels[truth] = RED
    return stored_as_shown(pixels, fmt, orientation)


BOX = (100, 60, 220, 180)


TRUTH = shape(400, 300, BOX)


def assert_instance(instance: dict[str, Any], truth: np.ndarray, box: tuple[int, ...],
                    least_iou: float) -> np.ndarray:  # fmt: skip
    edges = instance["box"]
    shown = (edges["x_min"], edges["y_min"], edges["x_max"], edges["y_max"])
    assert max(abs(a - b) for a, b in zip(shown, box, strict=True)) <= 1, shown
    assert instance["mask"]["size"] == list(truth.shape)
    mask = masks.decode(instance["mask"])
    assert masks.iou(mask, truth) >= least_iou, masks.iou(mask, truth)
    return mask
