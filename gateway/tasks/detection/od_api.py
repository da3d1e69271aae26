"""The OD API form: the TF Object Detection API's outputs -> detections in pixels of the
image, per request (plan form `od_api`).

`detection_boxes` are normalized [ymin, xmin, ymax, xmax] of the image the model saw,
`detection_scores` scores, `detection_classes` 1-based class ids, `num_detections` how
many rows count (rows after it are padding). This is the path of every request to such a
model: plain Python over lists, few calls per detection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.domain import BoxTransform, OutputError
from gateway.labels import Labels
from gateway.tasks.detection.nouns import Box, Detection, NormalizedBox
from gateway.upstream.tensors import Tensor, head

BOXES = "detection_boxes"
SCORES = "detection_scores"
CLASSES = "detection_classes"
NUM_DETECTIONS = "num_detections"
REQUIRED_OUTPUTS = (BOXES, SCORES, CLASSES, NUM_DETECTIONS)
# OD API exporters clip boxes to the image window, so a box edge past it is a rounding error
# at most; boxes farther out mean another output layout (pixels, or [x, y, w, h]) and would
# come out as garbage if clamped. Edges within this margin are clamped, others refused.
BOX_MARGIN = 0.05
# The API's class_id is an int32.
MAX_CLASS_ID = 2**31 - 1
# Makes the result tuples (Detection, Box, NormalizedBox) without the Python-level __new__
# NamedTuple classes have: three per detection of every request.
_make = tuple.__new__


def _checked(outputs: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
    missing = [k for k in REQUIRED_OUTPUTS if k not in outputs]
    if missing:
        raise OutputError(f"TF Serving response lacks outputs {missing}")
    for key in REQUIRED_OUTPUTS:
        dtype = outputs[key].dtype
        if dtype.kind not in "fiu":
            shown = "string" if dtype.kind == "O" else str(dtype)
            raise OutputError(f"{key} has dtype {shown}; expected numbers")
    boxes = outputs[BOXES]
    scores, classes, num = outputs[SCORES], outputs[CLASSES], outputs[NUM_DETECTIONS]
    shape = boxes.shape
    if len(shape) != 3 or shape[2] != 4 or shape[0] < 1:
        raise OutputError(f"{BOXES} has shape {list(shape)}; expected [1, N, 4]")
    n = shape[1]
    if scores.shape[:2] != (shape[0], n) or classes.shape[:2] != (shape[0], n):
        raise OutputError(
            f"{SCORES} {list(scores.shape)} and {CLASSES} {list(classes.shape)} "
            f"do not match {BOXES} {list(shape)}"
        )
    if math.prod(num.shape) < 1:
        raise OutputError(f"{NUM_DETECTIONS} is empty")
    return boxes, scores, classes, num


def valid_count(num: float, rows: int) -> int:
    if not math.isfinite(num) or num < 0 or num != int(num):
        raise OutputError(f"{NUM_DETECTIONS} is {num}; expected a whole number >= 0")
    if num > rows:
        raise OutputError(
            f"{NUM_DETECTIONS} is {int(num)} but the outputs hold only {rows} detections"
        )
    return int(num)


def _check_values(boxes: list[list[float]], scores: list[float], classes: list[float]) -> None:
    """Checks the rows given: scores in [0, 1], class ids in [0, MAX_CLASS_ID], normalized
    boxes within the image (plus BOX_MARGIN). NaN fails every comparison, so it is refused.
    (Plain Python over lists: for the tens of rows a model returns, faster than numpy.)"""
    for i, score in enumerate(scores):
        if not 0.0 <= score <= 1.0:
            raise OutputError(f"{SCORES}[{i}] is {score}; scores must be numbers in [0, 1]")
    for i, class_id in enumerate(classes):
        if not 0 <= class_id <= MAX_CLASS_ID:
            raise OutputError(
                f"{CLASSES}[{i}] is {float(class_id)}; class ids must be numbers from 0 to "
                f"{MAX_CLASS_ID} (the API's int32 class_id)"
            )
    low, high = -BOX_MARGIN, 1 + BOX_MARGIN
    for i, (ymin, xmin, ymax, xmax) in enumerate(boxes):
        if not (
            low <= ymin <= high and low <= xmin <= high and low <= ymax <= high
            and low <= xmax <= high
        ):  # fmt: skip
            shown = ", ".join(f"{v:g}" for v in boxes[i])
            raise OutputError(
                f"{BOXES}[{i}] is [{shown}], outside [0, 1]: the gateway needs normalized "
                "[ymin, xmin, ymax, xmax] boxes, as OD API exports give (not pixels)"
            )


def _floats(tensor: Tensor, count: int) -> list[Any]:
    """The first `count` values as Python floats (exact for every numeric dtype a model
    gives); `count` of scores or classes are those of the first batch item, of boxes its
    first count // 4 rows."""
    values = head(tensor, count)
    return values if tensor.dtype.kind == "f" else [float(v) for v in values]


def map_detections(
    outputs: Mapping[str, Tensor],
    *,
    width: int,
    height: int,
    labels: Labels,
    min_score: float,
    max_detections: int,
    transform: BoxTransform | None = None,
) -> list[Detection]:
    """Detections of the first batch item, best first, in pixels of a width x height image.

    Raises OutputError when the outputs are not what an OD API model gives: missing,
    misshapen or non-numeric tensors, num_detections beyond the arrays, NaN or out-of-range
    scores, class ids outside int32 or negative, boxes outside the image.

    Pixel edges round half up (an edge at 0.5 px belongs to the next pixel); the fractions
    are clamped to [0, 1] first, so pixels stay within [0, width] and [0, height].
    (This runs on every detection request: plain Python over lists, few calls per
    detection.)
    """
    boxes_tensor, scores_tensor, classes_tensor, num = _checked(outputs)
    valid = valid_count(float(head(num, 1)[0]), boxes_tensor.shape[1])
    flat = _floats(boxes_tensor, 4 * valid)
    boxes = [flat[i : i + 4] for i in range(0, 4 * valid, 4)]
    scores = _floats(scores_tensor, valid)
    classes = _floats(classes_tensor, valid)
    _check_values(boxes, scores, classes)
    # Best first. OD API models sort by score already; sorting again (stable: ties keep the
    # model's order) costs little and makes the contract hold for models that do not.
    kept = sorted([i for i in range(valid) if scores[i] >= min_score], key=scores.__getitem__,
                  reverse=True)[:max_detections]  # fmt: skip
    return to_detections(boxes, scores, classes, kept, width, height, labels, transform)


def to_detections(
    boxes: Sequence[Sequence[float]],
    scores: Sequence[float],
    classes: Sequence[float],
    kept: Iterable[int],
    width: int,
    height: int,
    labels: Labels,
    transform: BoxTransform | None,
) -> list[Detection]:
    """Detection tuples for the rows `kept`, in that order: normalized [ymin, xmin, ymax,
    xmax] boxes of the image the model received (Python floats), mapped to the displayed
    image, clamped to it, then to pixels of a width x height image; class values (checked
    already) rounded to class ids. Every form's detections are made here."""
    found: list[Detection] = []
    names = labels.names
    for i in kept:
        ymin, xmin, ymax, xmax = boxes[i]
        if transform is not None:
            ymin, xmin, ymax, xmax = transform((ymin, xmin, ymax, xmax))
        # Clamped to [0, 1] (inline: this loop is the hot path of every detection request).
        ymin = 0.0 if ymin < 0.0 else 1.0 if ymin > 1.0 else ymin
        xmin = 0.0 if xmin < 0.0 else 1.0 if xmin > 1.0 else xmin
        ymax = 0.0 if ymax < 0.0 else 1.0 if ymax > 1.0 else ymax
        xmax = 0.0 if xmax < 0.0 else 1.0 if xmax > 1.0 else xmax
        if ymin > ymax:
            ymin, ymax = ymax, ymin
        if xmin > xmax:
            xmin, xmax = xmax, xmin
        class_id = round(classes[i])
        box = _make(Box, (
            int(xmin * width + 0.5),
            int(ymin * height + 0.5),
            int(xmax * width + 0.5),
            int(ymax * height + 0.5),
        ))  # fmt: skip
        normalized = _make(NormalizedBox, (xmin, ymin, xmax, ymax))
        label = names.get(class_id) or labels.label(class_id)
        found.append(_make(Detection, (class_id, label, scores[i], box, normalized)))
    return found
