"""`[models.NAME.outputs]`: which signature output is what, where the names do not say
(OutputMapping), read from the model config file with each built-in task's keys and rules;
keys of another task and combinations that cannot work are refused naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.models.values import (
    CLASSIFICATION,
    DETECTION,
    ModelConfigError,
    read_choice,
    read_integer,
    read_number,
    refuse_unknown,
)

# YOLO heads: Ultralytics' own NMS IoU default; candidates kept for NMS after the score filter
# (a trained model leaves far fewer above its min_score; this bounds the work per image).
DEFAULT_NMS_IOU = 0.45
DEFAULT_MAX_CANDIDATES = 1000
BOX_FORMATS = ("yxyx", "xyxy", "xywh", "cxcywh")
BOX_COORDINATES = ("normalized", "pixels", "image_info")
DECODERS = ("yolo",)


@dataclass(frozen=True)
class OutputMapping:
    """`[models.NAME.outputs]`: which signature output is what, where the names do not say.

    `declared` holds the keys the config gave, so a plan can tell a choice from a default.
    """

    # classification
    probabilities: str | None = None
    logits: str | None = None
    logits_activation: str = "softmax"  # softmax | sigmoid (multi-label)
    label: str | None = None
    confidence: str | None = None
    # detection
    boxes: str | None = None
    scores: str | None = None
    classes: str | None = None
    num_detections: str | None = None
    box_format: str = "yxyx"
    box_coordinates: str = "normalized"
    image_info: str | None = None
    class_offset: int = 0
    # raw heads
    decoder: str | None = None  # yolo
    nms_iou: float = DEFAULT_NMS_IOU
    max_candidates: int = DEFAULT_MAX_CANDIDATES
    declared: frozenset[str] = frozenset()


_CLASSIFICATION_OUTPUTS = {"probabilities", "logits", "logits_activation", "label", "confidence"}
_DETECTION_OUTPUTS = {
    "boxes",
    "scores",
    "classes",
    "num_detections",
    "box_format",
    "box_coordinates",
    "image_info",
    "class_offset",
    "decoder",
    "nms_iou",
    "max_candidates",
}


def read_outputs(table: Mapping[str, Any], task: str, path: Path, where: str) -> OutputMapping:
    """The `[outputs]` table at `where` (e.g. models.NAME.outputs) of the file at `path`, for
    a model of `task`."""
    # The built-in tasks read their own keys; another task reads what it needs of either set.
    if task == CLASSIFICATION:
        own, other = _CLASSIFICATION_OUTPUTS, _DETECTION_OUTPUTS
    elif task == DETECTION:
        own, other = _DETECTION_OUTPUTS, _CLASSIFICATION_OUTPUTS
    else:
        own, other = _CLASSIFICATION_OUTPUTS | _DETECTION_OUTPUTS, set()
    for key in table:
        if key in other:
            raise ModelConfigError(f"{path}: {where}.{key} does not apply to task '{task}'")
    refuse_unknown(table, own, str(path), where + ".")
    names: dict[str, Any] = {}
    for key in own - {"logits_activation", "box_format", "box_coordinates", "class_offset",
                      "decoder", "nms_iou", "max_candidates"}:  # fmt: skip
        if key in table:
            value = table[key]
            if not isinstance(value, str) or not value:
                raise ModelConfigError(
                    f"{path}: {where}.{key} must name an output of the signature"
                )
            names[key] = value
    declared = frozenset(table)
    if task == CLASSIFICATION:
        forms = [k for k in ("probabilities", "logits", "label") if k in table]
        if len(forms) > 1:
            raise ModelConfigError(
                f"{path}: {where} sets {' and '.join(forms)}; a classifier's scores are one of "
                "probabilities, logits, or label + confidence"
            )
        if ("label" in table) != ("confidence" in table):
            raise ModelConfigError(f"{path}: {where}.label and .confidence go together")
        activation = read_choice(table, "logits_activation", ("softmax", "sigmoid"), path, where)
        if activation is not None and "logits" not in table:
            raise ModelConfigError(f"{path}: {where}.logits_activation needs logits = '<output>'")
        return OutputMapping(**names, logits_activation=activation or "softmax", declared=declared)
    box_format = read_choice(table, "box_format", BOX_FORMATS, path, where) or "yxyx"
    coordinates = (
        read_choice(table, "box_coordinates", BOX_COORDINATES, path, where) or "normalized"
    )
    if "image_info" in table and coordinates != "image_info":
        raise ModelConfigError(f"{path}: {where}.image_info is for box_coordinates = 'image_info'")
    class_offset = 0
    if "class_offset" in table:
        class_offset = table["class_offset"]
        if not isinstance(class_offset, int) or isinstance(class_offset, bool):
            raise ModelConfigError(f"{path}: {where}.class_offset must be a whole number")
    decoder = read_choice(table, "decoder", DECODERS, path, where)
    nms_iou = read_number(table, "nms_iou", path, where, 0.0, 1.0)
    max_candidates = read_integer(table, "max_candidates", path, where)
    if decoder is None and ("nms_iou" in table or "max_candidates" in table):
        raise ModelConfigError(
            f"{path}: {where}.nms_iou and .max_candidates are for decoder = 'yolo' (models "
            "that give raw candidates); other detection models do NMS in their graph"
        )
    if decoder is not None:
        clash = sorted(
            set(table) & {"boxes", "scores", "classes", "num_detections", "box_format",
                          "box_coordinates", "image_info"}
        )  # fmt: skip
        if clash:
            raise ModelConfigError(
                f"{path}: {where}.decoder = '{decoder}' reads the head's one output itself; "
                f"remove {', '.join(clash)}"
            )
    return OutputMapping(
        **names,
        box_format=box_format,
        box_coordinates=coordinates,
        class_offset=class_offset,
        decoder=decoder,
        nms_iou=DEFAULT_NMS_IOU if nms_iou is None else nms_iou,
        max_candidates=max_candidates or DEFAULT_MAX_CANDIDATES,
        declared=declared,
    )
