"""Maps the generic OD API outputs to detections in pixels of the displayed image.

The model reports `detection_boxes` as normalized [ymin, xmin, ymax, xmax] of the image it
saw, `detection_scores` sorted descending, 1-based `detection_classes` and `num_detections`
(the rows after it are padding).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from gateway.domain import Box, Detection, NormalizedBox
from gateway.labelmap import LabelMap

BOXES = "detection_boxes"
SCORES = "detection_scores"
CLASSES = "detection_classes"
NUM_DETECTIONS = "num_detections"
REQUIRED_OUTPUTS = (BOXES, SCORES, CLASSES, NUM_DETECTIONS)

# (ymin, xmin, ymax, xmax) normalized box of the image the model saw -> the same box
# normalized to the displayed image (EXIF orientation applied).
BoxTransform = Callable[[tuple[float, float, float, float]], tuple[float, float, float, float]]


class OutputError(ValueError):
    """Model outputs that do not have the OD API shapes."""


def _pixel(fraction: float, size: int) -> int:
    # Round half up, then clamp: a box edge at 0.5 px belongs to the next pixel.
    return min(max(math.floor(fraction * size + 0.5), 0), size)


def _checked(outputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    missing = [k for k in REQUIRED_OUTPUTS if k not in outputs]
    if missing:
        raise OutputError(f"TF Serving response lacks outputs {missing}")
    boxes = outputs[BOXES]
    scores, classes, num = outputs[SCORES], outputs[CLASSES], outputs[NUM_DETECTIONS]
    if boxes.ndim != 3 or boxes.shape[2] != 4 or boxes.shape[0] < 1:
        raise OutputError(f"{BOXES} has shape {list(boxes.shape)}; expected [1, N, 4]")
    n = boxes.shape[1]
    if scores.shape[:2] != (boxes.shape[0], n) or classes.shape[:2] != (boxes.shape[0], n):
        raise OutputError(
            f"{SCORES} {list(scores.shape)} and {CLASSES} {list(classes.shape)} "
            f"do not match {BOXES} {list(boxes.shape)}"
        )
    if num.size < 1:
        raise OutputError(f"{NUM_DETECTIONS} is empty")
    return boxes[0], scores[0], classes[0], num.reshape(-1)


def map_detections(
    outputs: Mapping[str, np.ndarray],
    *,
    width: int,
    height: int,
    label_map: LabelMap,
    min_score: float,
    max_detections: int,
    transform: BoxTransform | None = None,
) -> list[Detection]:
    """Detections of the first batch item, best first, in pixels of a width x height image."""
    boxes, scores, classes, num = _checked(outputs)
    valid = min(max(int(num[0]), 0), boxes.shape[0])
    found: list[Detection] = []
    for i in range(valid):
        score = float(scores[i])
        if not score >= min_score:  # also drops NaN
            continue
        ymin, xmin, ymax, xmax = (float(v) for v in boxes[i])
        if transform is not None:
            ymin, xmin, ymax, xmax = transform((ymin, xmin, ymax, xmax))
        ymin, ymax = sorted((min(max(ymin, 0.0), 1.0), min(max(ymax, 0.0), 1.0)))
        xmin, xmax = sorted((min(max(xmin, 0.0), 1.0), min(max(xmax, 0.0), 1.0)))
        class_id = round(float(classes[i]))
        found.append(
            Detection(
                class_id=class_id,
                label=label_map.label(class_id),
                score=score,
                box=Box(
                    x_min=_pixel(xmin, width),
                    y_min=_pixel(ymin, height),
                    x_max=_pixel(xmax, width),
                    y_max=_pixel(ymax, height),
                ),
                normalized=NormalizedBox(x_min=xmin, y_min=ymin, x_max=xmax, y_max=ymax),
            )
        )
    # OD API models sort by score already; sorting again costs nothing and makes the
    # contract hold for models that do not.
    found.sort(key=lambda d: d.score, reverse=True)
    return found[:max_detections]
