"""Class-wise non-maximum suppression, with TensorFlow's rules (tf.image.non_max_suppression).

Boxes are visited best score first; a box is dropped when its IoU with a kept box of the same
class is above the threshold. IoU is intersection over union of the boxes' extents (corners
may come in either order), 0 when either box has no area.
"""

from __future__ import annotations

import numpy as np


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one [4] yxyx box with [N, 4] boxes."""
    ymin = np.minimum(box[0], box[2])
    ymax = np.maximum(box[0], box[2])
    xmin = np.minimum(box[1], box[3])
    xmax = np.maximum(box[1], box[3])
    o_ymin = np.minimum(others[:, 0], others[:, 2])
    o_ymax = np.maximum(others[:, 0], others[:, 2])
    o_xmin = np.minimum(others[:, 1], others[:, 3])
    o_xmax = np.maximum(others[:, 1], others[:, 3])
    area = (ymax - ymin) * (xmax - xmin)
    areas = (o_ymax - o_ymin) * (o_xmax - o_xmin)
    inter_h = np.maximum(np.minimum(ymax, o_ymax) - np.maximum(ymin, o_ymin), 0.0)
    inter_w = np.maximum(np.minimum(xmax, o_xmax) - np.maximum(xmin, o_xmin), 0.0)
    inter = inter_h * inter_w
    union = area + areas - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        result = np.where((area > 0) & (areas > 0) & (union > 0), inter / union, 0.0)
    return result


def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    iou_threshold: float,
    max_output: int,
) -> np.ndarray:
    """Indices of the boxes kept, best score first; boxes of different classes never
    suppress each other. `boxes` [N, 4] yxyx, `scores` [N], `classes` [N]."""
    order = np.argsort(-scores, kind="stable")
    kept: list[int] = []
    suppressed = np.zeros(len(order), dtype=bool)
    sorted_boxes = boxes[order]
    sorted_classes = classes[order]
    for position in range(len(order)):
        if len(kept) >= max_output:
            break
        if suppressed[position]:
            continue
        kept.append(int(order[position]))
        rest = slice(position + 1, None)
        same = sorted_classes[rest] == sorted_classes[position]
        if not same.any():
            continue
        overlap = iou(sorted_boxes[position], sorted_boxes[rest]) > iou_threshold
        suppressed[rest] |= same & overlap
    return np.asarray(kept, dtype=np.int64)
