"""The reference segmenter, keypoint model and embedder (serving.segmenter, serving.pose,
serving.embedder) computed again in numpy from their input, independently of TensorFlow: what
tests/serving/test_task_models.py compares their exported SavedModels with, and the
signatures TF Serving's metadata gives for them.

Made for pictures whose pixels are exact palette colours on a background far from the palette
(PNG, no noise), where the nearest-colour test has no borderline pixels.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tensorflow.core.framework import types_pb2

from serving.detector import COLOUR_THRESHOLD, MAX_DETECTIONS
from serving.embedder import DIMENSION, GRID
from serving.pose import CANDIDATES, CHANNELS, FIGURE
from serving.scenes import PALETTE
from serving.segmenter import MASK_SIZE

# (inputs, outputs): alias -> (dtype, shape), as GetModelMetadata describes them.
_FLOAT = types_pb2.DT_FLOAT
SIGNATURES = {
    "maskrcnn": (
        {"input_tensor": (types_pb2.DT_UINT8, [1, -1, -1, 3])},
        {
            "detection_boxes": (_FLOAT, [1, MAX_DETECTIONS, 4]),
            "detection_scores": (_FLOAT, [1, MAX_DETECTIONS]),
            "detection_classes": (_FLOAT, [1, MAX_DETECTIONS]),
            "num_detections": (_FLOAT, [1]),
            "detection_masks": (_FLOAT, [1, MAX_DETECTIONS, MASK_SIZE, MASK_SIZE]),
        },
    ),
    "pose": (
        {"images": (_FLOAT, [1, 640, 640, 3])},
        {"output_0": (_FLOAT, [1, CHANNELS, CANDIDATES])},
    ),
    "embedder": (
        {"inputs": (_FLOAT, [-1, 224, 224, 3])},
        {"output_0": (_FLOAT, [-1, DIMENSION])},
    ),
}


def _window(x: np.ndarray, fill: float, reduce: str) -> np.ndarray:
    """3 x 3 max (or min) over in-bounds neighbours, as max_pool2d with SAME padding."""
    padded = np.pad(x, ((1, 1), (1, 1), (0, 0)), constant_values=fill)
    windows = sliding_window_view(padded, (3, 3), axis=(0, 1))
    return windows.max(axis=(-2, -1)) if reduce == "max" else windows.min(axis=(-2, -1))


def class_masks(pixels: np.ndarray) -> np.ndarray:
    """bool [H, W, K]: serving.detector.class_masks in numpy (nearest palette colour within
    the threshold; border repeated 4 px, opened then closed 3 x 3)."""
    palette = np.array([c.rgb for c in PALETTE], np.float64)
    dist2 = ((pixels.astype(np.float64)[..., None, :] - palette) ** 2).sum(-1)
    nearest = dist2.argmin(-1)
    mask = (np.arange(len(PALETTE)) == nearest[..., None]) & (dist2 < COLOUR_THRESHOLD**2)
    height, width = mask.shape[:2]
    rows = np.clip(np.arange(-4, height + 4), 0, height - 1)
    cols = np.clip(np.arange(-4, width + 4), 0, width - 1)
    x = mask[rows][:, cols].astype(np.float32)

    def dilate(t: np.ndarray) -> np.ndarray:
        return _window(t, -np.inf, "max")

    def erode(t: np.ndarray) -> np.ndarray:
        return _window(t, np.inf, "min")

    x = erode(dilate(dilate(erode(x))))
    return x[4 : 4 + height, 4 : 4 + width] > 0.5


def instances(pixels: np.ndarray) -> list[tuple[int, np.ndarray, float, np.ndarray]]:
    """(class index, pixel box y0 x0 y1 x1, score, mask [H, W]) per colour present, best
    score first (ties: class order)."""
    masks = class_masks(pixels)
    found = []
    for k in range(masks.shape[-1]):
        mask = masks[..., k]
        if not mask.any():
            continue
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        box = np.array([rows[0], cols[0], rows[-1] + 1, cols[-1] + 1], np.float64)
        fill = mask.sum() / ((box[2] - box[0]) * (box[3] - box[1]))
        found.append((k, box, 0.5 + 0.5 * fill, mask))
    return sorted(found, key=lambda item: -item[2])  # sorted() is stable


def cell_samples(mask: np.ndarray, box: np.ndarray, cells: int) -> np.ndarray:
    """[cells, cells]: `mask` bilinearly sampled at the centres of the box's cells (pixel
    centres at integer + 0.5), 0 where a centre lies outside the picture's pixel centres (as
    tf.image.crop_and_resize extrapolates)."""
    y0, x0, y1, x1 = box
    height, width = mask.shape
    ys = y0 + (np.arange(cells) + 0.5) * (y1 - y0) / cells - 0.5
    xs = x0 + (np.arange(cells) + 0.5) * (x1 - x0) / cells - 0.5
    values = mask.astype(np.float64)

    def taps(coords: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        low = np.clip(np.floor(coords), 0, size - 1).astype(int)
        high = np.clip(np.ceil(coords), 0, size - 1).astype(int)
        return low, high, coords - np.floor(coords)

    top, bottom, fy = taps(ys, height)
    left, right, fx = taps(xs, width)
    upper = values[top][:, left] * (1 - fx) + values[top][:, right] * fx
    lower = values[bottom][:, left] * (1 - fx) + values[bottom][:, right] * fx
    grid = upper * (1 - fy[:, None]) + lower * fy[:, None]
    inside = ((ys >= 0) & (ys <= height - 1))[:, None] & ((xs >= 0) & (xs <= width - 1))
    return np.where(inside, grid, 0.0)


def segmenter(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """serving.segmenter's outputs (no batch dimension) for uint8 [H, W, 3] pixels."""
    height, width = pixels.shape[:2]
    out = {
        "detection_boxes": np.zeros((MAX_DETECTIONS, 4)),
        "detection_scores": np.zeros(MAX_DETECTIONS),
        "detection_classes": np.zeros(MAX_DETECTIONS),
        "detection_masks": np.zeros((MAX_DETECTIONS, MASK_SIZE, MASK_SIZE)),
    }
    found = instances(pixels)
    for row, (k, box, score, mask) in enumerate(found):
        out["detection_boxes"][row] = box / [height, width, height, width]
        out["detection_scores"][row] = score
        out["detection_classes"][row] = k + 1
        out["detection_masks"][row] = cell_samples(mask, box, MASK_SIZE)
    out["num_detections"] = np.array(len(found), np.float64)
    return out


def pose(pixels: np.ndarray) -> np.ndarray:
    """serving.pose's output_0 [56, 100] for uint8 [640, 640, 3] pixels."""
    head = np.zeros((CHANNELS, CANDIDATES))
    figure = np.array(FIGURE)
    for column, (_, box, score, _) in enumerate(instances(pixels)):
        y0, x0, y1, x1 = box
        points = np.stack(
            [
                x0 + (x1 - x0) * figure[:, 0],
                y0 + (y1 - y0) * figure[:, 1],
                np.full(len(figure), score),
            ],
            axis=1,
        )
        head[:, column] = [(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0, score, *points.ravel()]
    return head


def embedder(images: np.ndarray) -> np.ndarray:
    """serving.embedder's output_0 [B, 48] for float [B, 224, 224, 3] in [0, 1]."""
    cell = images.shape[1] // GRID
    grid = images.reshape(len(images), GRID, cell, GRID, cell, 3).astype(np.float64)
    return (grid.mean(axis=(2, 4)) - 0.5).reshape(len(images), DIMENSION)
