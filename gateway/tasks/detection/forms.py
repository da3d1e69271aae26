"""The forms other than OD API's, per request (plan forms `boxes` and `yolo`): boxes under
other names or in other formats and coordinates (through gateway.tasks.decoders.boxes), and
raw YOLO heads decoded and NMS'd (gateway.tasks.decoders.yolo) -> detections in pixels of the
image. numpy over the arrays; the outputs are checked as the OD API form's are."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from gateway.domain import Frame, OutputError
from gateway.labels import Labels
from gateway.tasks.base import numbers
from gateway.tasks.decoders import boxes as box_forms
from gateway.tasks.decoders import yolo
from gateway.tasks.detection.nouns import Detection, Kept
from gateway.tasks.detection.od_api import BOX_MARGIN, MAX_CLASS_ID, to_detections, valid_count
from gateway.tasks.detection.plans import DetectionPlan
from gateway.upstream.tensors import Tensor


class Decoded(NamedTuple):
    """The detections of the first batch item, best first, in pixels of the image; the rows
    of the outputs they came from (the index along the N of [1, N, ...] outputs, or the
    candidate of a YOLO head), for tasks that read more per detection (keypoints, masks); and
    their boxes as the model gave them: [n, 4] normalized (ymin, xmin, ymax, xmax) of the
    image sent, before the frame's transform and clamping (for masks pasted into the box)."""

    found: list[Detection]
    rows: np.ndarray
    boxes: np.ndarray


def map_decoded(
    outputs: Mapping[str, Tensor], plan: DetectionPlan, frame: Frame, labels: Labels, kept: Kept
) -> Decoded:
    """The detections of a plan of form `boxes` or `yolo` (an `od_api` plan is read as the
    `boxes` form), those `kept` keeps; class values plus the plan's `class_offset` checked as
    class ids."""
    decode = _yolo if plan.form == "yolo" else _boxes
    normalized, scores, classes, classes_key, rows = decode(outputs, plan, frame.sent, kept)
    class_ids = classes.astype(np.float64) + plan.class_offset
    with np.errstate(invalid="ignore"):
        bad = ~((class_ids >= 0) & (class_ids <= MAX_CLASS_ID))
    if bad.any():
        i = int(np.argmax(bad))
        raise OutputError(
            f"{classes_key}[{i}] gives class id {float(class_ids[i])}; class ids must be "
            f"numbers from 0 to {MAX_CLASS_ID} (set outputs.class_offset if the model counts "
            "from another base)"
        )
    found = to_detections(
        normalized.tolist(),
        scores.tolist(),
        class_ids.tolist(),
        range(len(class_ids)),
        frame.width,
        frame.height,
        labels,
        frame.transform,
    )
    return Decoded(found, rows, normalized)


# The kept rows of a decoded form: normalized yxyx boxes of the image sent, their scores and
# class values, the output that gave the classes (for messages), and the rows they came from.
_Decoded = tuple[np.ndarray, np.ndarray, np.ndarray, str, np.ndarray]


def _boxes(
    outputs: Mapping[str, Tensor], plan: DetectionPlan, sent: tuple[int, int] | None, kept: Kept
) -> _Decoded:
    boxes = numbers(outputs, plan.boxes)
    scores = numbers(outputs, plan.scores)
    classes = numbers(outputs, plan.classes)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or boxes.shape[0] < 1:
        raise OutputError(f"{plan.boxes} has shape {list(boxes.shape)}; expected [1, N, 4]")
    rows = boxes.shape[1]
    if scores.shape[:2] != (boxes.shape[0], rows) or classes.shape[:2] != (boxes.shape[0], rows):
        raise OutputError(
            f"{plan.scores} {list(scores.shape)} and {plan.classes} {list(classes.shape)} "
            f"do not match {plan.boxes} {list(boxes.shape)}"
        )
    valid = rows
    if plan.num_detections is not None:
        num = numbers(outputs, plan.num_detections).reshape(-1)
        if num.size < 1:
            raise OutputError(f"{plan.num_detections} is empty")
        valid = valid_count(float(num[0]), rows)
    score = scores[0, :valid].astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~((score >= 0.0) & (score <= 1.0))
    if bad.any():
        i = int(np.argmax(bad))
        raise OutputError(f"{plan.scores}[{i}] is {score[i]}; scores must be numbers in [0, 1]")
    chosen = np.flatnonzero(score >= kept.min_score)
    chosen = chosen[np.argsort(-score[chosen], kind="stable")][: kept.max_detections]
    image_info = None
    if plan.image_info is not None:
        image_info = numbers(outputs, plan.image_info)[0]
    try:
        yxyx = box_forms.to_yxyx(boxes[0, chosen], plan.box_format)
        normalized = box_forms.normalize(yxyx, plan.box_coordinates, sent, image_info)
    except box_forms.BoxError as e:
        raise OutputError(str(e)) from None
    if not np.isfinite(normalized).all():
        raise OutputError(f"{plan.boxes} holds NaN or infinite values")
    if plan.box_coordinates == "normalized":
        outside = (normalized < -BOX_MARGIN) | (normalized > 1 + BOX_MARGIN)
        if outside.any():
            i = int(np.argmax(outside.any(axis=1)))
            shown = ", ".join(f"{v:g}" for v in boxes[0, chosen[i]])
            raise OutputError(
                f"{plan.boxes}[{int(chosen[i])}] is [{shown}], outside [0, 1]: set "
                "outputs.box_coordinates (pixels, image_info) and outputs.box_format in the "
                "model config if the boxes are not normalized "
                f"[{', '.join(plan.box_format)}]"
            )
    return normalized, score[chosen], classes[0, chosen], plan.classes, chosen


def _yolo(
    outputs: Mapping[str, Tensor], plan: DetectionPlan, sent: tuple[int, int] | None, kept: Kept
) -> _Decoded:
    assert plan.head is not None
    raw = numbers(outputs, plan.head)
    if raw.ndim != 3 or raw.shape[0] < 1 or raw.shape[1] < 5:
        raise OutputError(
            f"{plan.head} has shape {list(raw.shape)}; expected [1, 4 + classes, candidates]"
        )
    head_values = raw[0].astype(np.float32, copy=False)
    if not np.isfinite(head_values).all():
        raise OutputError(f"{plan.head} holds NaN or infinite values")
    decoded = yolo.decode(
        head_values,
        min_score=kept.min_score,
        nms_iou=plan.nms_iou,
        max_candidates=plan.max_candidates,
        max_detections=kept.max_detections,
    )
    try:
        normalized = box_forms.normalize(decoded.boxes, "pixels", sent)
    except box_forms.BoxError as e:
        raise OutputError(str(e)) from None
    return normalized, decoded.scores, decoded.classes, plan.head, decoded.rows
