"""The detection task: a detector's outputs -> detections in pixels of the image.

The plan is chosen once per model version from the signature and `[models.NAME.outputs]`:
- `od_api`: the TF Object Detection API's outputs (`detection_boxes` as normalized [ymin,
  xmin, ymax, xmax] of the image the model saw, `detection_scores`, 1-based
  `detection_classes`, `num_detections`; rows after it are padding), read by the plain-Python
  fast path below;
- `boxes`: the same four roles under other names or in other forms (box format, pixel or
  Model Garden `image_info` coordinates, a class offset, no `num_detections`), through
  gateway.tasks.decoders;
- `yolo`: a raw `[batch, 4 + classes, candidates]` head, decoded and NMS'd here.
What the signature and config cannot settle is refused at startup, naming the key to set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gateway import errors
from gateway.config import Settings
from gateway.labels import Labels
from gateway.models import DETECTION, ModelConfig, OutputMapping
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import BoxTransform, Frame, OutputError, OutputPlan
from gateway.tasks.decoders import boxes as box_forms
from gateway.tasks.decoders import yolo
from gateway.tasks.types import Box, Detection, Detections, DetectOptions, NormalizedBox
from gateway.upstream.signatures import Signature, TensorSpec
from gateway.upstream.tensors import Tensor, as_array, head

BOXES = "detection_boxes"
SCORES = "detection_scores"
CLASSES = "detection_classes"
NUM_DETECTIONS = "num_detections"
REQUIRED_OUTPUTS = (BOXES, SCORES, CLASSES, NUM_DETECTIONS)
IMAGE_INFO = "image_info"  # Model Garden's [batch, 4, 2] record of its own resizing
# Output names of anchor-based raw heads (keras-hub RetinaNet's Model.export, Model Garden
# exported without its detection generator, OD API's pre-NMS tensors alone): anchor deltas
# and class logits, which need the model's anchors and box coder to decode.
RAW_HEAD_OUTPUTS = frozenset(
    {"bbox_regression", "cls_logits", "box_outputs", "cls_outputs", "raw_boxes", "raw_scores"}
)
_FLOATS = (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF, tfs.DT_BFLOAT16)
_NUMBERS = (*_FLOATS, tfs.DT_INT32, tfs.DT_INT64, tfs.DT_INT16, tfs.DT_INT8, tfs.DT_UINT8)
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


def _valid_count(num: float, rows: int) -> int:
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
    valid = _valid_count(float(head(num, 1)[0]), boxes_tensor.shape[1])
    flat = _floats(boxes_tensor, 4 * valid)
    boxes = [flat[i : i + 4] for i in range(0, 4 * valid, 4)]
    scores = _floats(scores_tensor, valid)
    classes = _floats(classes_tensor, valid)
    _check_values(boxes, scores, classes)
    # Best first. OD API models sort by score already; sorting again (stable: ties keep the
    # model's order) costs little and makes the contract hold for models that do not.
    kept = sorted([i for i in range(valid) if scores[i] >= min_score], key=scores.__getitem__,
                  reverse=True)[:max_detections]  # fmt: skip
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


class DetectionSettings(NamedTuple):
    """A request's detection options with the defaults filled in."""

    min_score: float
    max_detections: int


class DetectionTask:
    name = DETECTION

    def resolve(
        self, options: DetectOptions, config: ModelConfig, settings: Settings
    ) -> DetectionSettings:
        min_score = config.min_score if config.min_score is not None else settings.min_score
        max_detections = config.max_detections or settings.max_detections
        if math.isnan(options.min_score) or not 0.0 <= options.min_score <= 1.0:
            raise errors.invalid_input(
                f"min_score must be in [0, 1] (0 means the server default {min_score}), "
                f"got {options.min_score}"
            )
        if options.max_detections < 0:
            raise errors.invalid_input(
                f"max_detections must be >= 0 (0 means the server default "
                f"{max_detections}), got {options.max_detections}"
            )
        return DetectionSettings(
            min_score=options.min_score or min_score,
            max_detections=options.max_detections or max_detections,
        )

    def output_plan(self, signature: Signature, config: ModelConfig) -> DetectionPlan:
        return plan_outputs(signature, config.outputs)

    def map(
        self,
        outputs: Mapping[str, Tensor],
        plan: OutputPlan,
        frame: Frame,
        options: DetectionSettings,
        config: ModelConfig,
    ) -> Detections:
        if plan.form == "od_api":
            return Detections(
                map_detections(
                    outputs,
                    width=frame.width,
                    height=frame.height,
                    labels=config.labels,
                    min_score=options.min_score,
                    max_detections=options.max_detections,
                    transform=frame.transform,
                )
            )
        assert isinstance(plan, DetectionPlan)
        if plan.form == "yolo":
            return Detections(_map_yolo(outputs, plan, frame, options, config.labels))
        return Detections(_map_boxes(outputs, plan, frame, options, config.labels))

    def summary(self, result: Detections) -> dict[str, object]:
        return {"detections": len(result.detections)}


@dataclass(frozen=True)
class DetectionPlan(OutputPlan):
    """Which output is what for one model version, in which form (see the module doc)."""

    boxes: str = BOXES
    scores: str = SCORES
    classes: str = CLASSES
    num_detections: str | None = NUM_DETECTIONS
    box_format: str = "yxyx"
    box_coordinates: str = "normalized"
    image_info: str | None = None
    class_offset: int = 0
    head: str | None = None  # the raw head's output (yolo)
    nms_iou: float = 0.0
    max_candidates: int = 0
    exporter: str = ""  # who makes outputs of this form, for check-models

    def describe(self) -> dict[str, object]:
        if self.form == "yolo":
            return {
                "form": "yolo raw head [batch, 4 + classes, candidates]",
                "head": self.head,
                "boxes": "cxcywh in pixels of the image sent",
                "nms": f"class-wise, IoU {self.nms_iou}, at most {self.max_candidates} "
                "candidates after min_score",
            }
        plan: dict[str, object] = {
            "form": self.exporter or "declared in the model config",
            "boxes": self.boxes,
            "scores": self.scores,
            "classes": self.classes,
            "num_detections": self.num_detections or "none: every row, filtered by score",
            "box_format": self.box_format,
            "box_coordinates": self.box_coordinates,
            "class_offset": self.class_offset,
        }
        if self.image_info is not None:
            plan["image_info"] = self.image_info
        return plan


def plan_outputs(signature: Signature, mapping: OutputMapping) -> DetectionPlan:
    """The detection plan for `signature` with the model config's `[outputs]`; BAD_MODEL
    naming the config key to set when the signature leaves more than one reading."""
    outputs = signature.outputs
    what = f"model '{signature.model}' version {signature.version}"
    shown = f"its '{signature.name}' signature has {signature.describe()}"
    if mapping.decoder == "yolo":
        return _yolo_plan(signature, mapping, what, shown)
    names = {
        "boxes": mapping.boxes or BOXES,
        "scores": mapping.scores or SCORES,
        "classes": mapping.classes or CLASSES,
    }
    missing = {key: name for key, name in names.items() if name not in outputs}
    if missing:
        declared = [k for k in missing if k in mapping.declared]
        if declared:
            key = declared[0]
            raise errors.bad_model(
                f"the model config says outputs.{key} = '{missing[key]}' but {what} has no "
                f"such output: {shown}"
            )
        raise errors.bad_model(_unrecognised(signature, what, shown))
    for key, name in names.items():
        spec = outputs[name]
        if spec.dtype not in _NUMBERS:
            raise errors.bad_model(
                f"{what}: output '{name}' ({key}) is {spec.describe()}; expected numbers"
            )
    num: str | None = mapping.num_detections
    if num is not None and num not in outputs:
        raise errors.bad_model(
            f"the model config says outputs.num_detections = '{num}' but {what} has no such "
            f"output: {shown}"
        )
    if num is None and "num_detections" not in mapping.declared and NUM_DETECTIONS in outputs:
        num = NUM_DETECTIONS
    coordinates = mapping.box_coordinates
    exporter = ""
    if "box_coordinates" not in mapping.declared:
        if IMAGE_INFO in outputs:
            raise errors.bad_model(
                f"{what} gives an '{IMAGE_INFO}' output, as TF Model Garden exports do: its "
                "boxes are in pixels of the model's own rescaled input, unless it was exported "
                "with output_normalized_coordinates, and the signature does not say which. Set "
                "outputs.box_coordinates = 'image_info' (Model Garden's default export) or "
                "'normalized' in the model config"
            )
        if mapping.declared & {"boxes", "scores", "classes", "box_format"}:
            exporter = ""
        else:
            exporter = "TF Object Detection API"
    elif coordinates == "image_info" and mapping.declared <= {"box_coordinates"}:
        exporter = "TF Model Garden"
    info = None
    if coordinates == "image_info":
        info = mapping.image_info or IMAGE_INFO
        if info not in outputs:
            raise errors.bad_model(
                f"the model config says outputs.box_coordinates = 'image_info' but {what} has "
                f"no '{info}' output ({shown}); name it with outputs.image_info"
            )
    fast = (
        names == {"boxes": BOXES, "scores": SCORES, "classes": CLASSES}
        and num == NUM_DETECTIONS
        and mapping.box_format == "yxyx"
        and coordinates == "normalized"
        and mapping.class_offset == 0
    )
    wanted = [names["boxes"], names["scores"], names["classes"]]
    wanted += [name for name in (num, info) if name is not None]
    return DetectionPlan(
        tuple(wanted),
        "od_api" if fast else "boxes",
        boxes=names["boxes"],
        scores=names["scores"],
        classes=names["classes"],
        num_detections=num,
        box_format=mapping.box_format,
        box_coordinates=coordinates,
        image_info=info,
        class_offset=mapping.class_offset,
        exporter=exporter,
    )


def _yolo_plan(
    signature: Signature, mapping: OutputMapping, what: str, shown: str
) -> DetectionPlan:
    if len(signature.outputs) != 1:
        raise errors.bad_model(
            f"the model config says outputs.decoder = 'yolo', which reads a signature's one "
            f"output [batch, 4 + classes, candidates], but {shown}"
        )
    ((name, spec),) = signature.outputs.items()
    if not _is_yolo_head(spec):
        raise errors.bad_model(
            f"the model config says outputs.decoder = 'yolo' but {what}'s output '{name}' is "
            f"{spec.describe()}; a YOLO head is float [batch, 4 + classes, candidates] (an "
            "Ultralytics export with nms=False)"
        )
    return DetectionPlan(
        (name,),
        "yolo",
        head=name,
        nms_iou=mapping.nms_iou,
        max_candidates=mapping.max_candidates,
        class_offset=mapping.class_offset,
    )


def _is_yolo_head(spec: TensorSpec) -> bool:
    shape = spec.shape
    return (
        spec.dtype in _FLOATS
        and shape is not None
        and len(shape) == 3
        and (shape[1] == -1 or shape[1] >= 5)
    )


def _unrecognised(signature: Signature, what: str, shown: str) -> str:
    outputs = signature.outputs
    raw = sorted(RAW_HEAD_OUTPUTS & set(outputs))
    if raw:
        return (
            f"{what} gives an anchor-based raw head ({', '.join(raw)}: anchor box deltas and "
            f"class logits), which the gateway cannot decode: decoding needs the model's "
            f"anchors and box coder, and NMS. Export the model with its decoding and NMS in "
            f"the graph instead (keras-hub: a tf.function around the detector's predict() "
            f"path, which gives boxes, scores, classes and num_detections; TF Model Garden: "
            f"export_saved_model_lib with the detection generator's apply_nms), then name "
            f"those outputs in [models.NAME.outputs]"
        )
    if len(outputs) == 1 and _is_yolo_head(next(iter(outputs.values()))):
        return (
            f"{what} cannot be used for detection as it is: {shown}. If that one output is a "
            f"YOLO head [batch, 4 + classes, candidates] (YOLOv5u/v8/v11 exports), set "
            f"outputs.decoder = 'yolo' in the model config"
        )
    return (
        f"{what} cannot be used for detection: {shown}; name its outputs in the model "
        f"config: outputs.boxes, outputs.scores, outputs.classes (and num_detections, "
        f"box_format, box_coordinates as they are), or outputs.decoder = 'yolo' for a raw "
        f"YOLO head (TF Object Detection API exports need no config)"
    )


def _array(outputs: Mapping[str, Tensor], key: str) -> np.ndarray:
    if key not in outputs:
        raise OutputError(f"TF Serving response lacks output '{key}'")
    values = as_array(outputs[key])
    if values.dtype.kind not in "fiu":
        raise OutputError(f"{key} has dtype {values.dtype}; expected numbers")
    return values


def _map_boxes(
    outputs: Mapping[str, Tensor],
    plan: DetectionPlan,
    frame: Frame,
    options: DetectionSettings,
    labels: Labels,
) -> list[Detection]:
    boxes = _array(outputs, plan.boxes)
    scores = _array(outputs, plan.scores)
    classes = _array(outputs, plan.classes)
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
        num = _array(outputs, plan.num_detections).reshape(-1)
        if num.size < 1:
            raise OutputError(f"{plan.num_detections} is empty")
        valid = _valid_count(float(num[0]), rows)
    score = scores[0, :valid].astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~((score >= 0.0) & (score <= 1.0))
    if bad.any():
        i = int(np.argmax(bad))
        raise OutputError(f"{plan.scores}[{i}] is {score[i]}; scores must be numbers in [0, 1]")
    kept = np.flatnonzero(score >= options.min_score)
    kept = kept[np.argsort(-score[kept], kind="stable")][: options.max_detections]
    image_info = None
    if plan.image_info is not None:
        image_info = _array(outputs, plan.image_info)[0]
    try:
        yxyx = box_forms.to_yxyx(boxes[0, kept], plan.box_format)
        normalized = box_forms.normalize(yxyx, plan.box_coordinates, frame.sent, image_info)
    except box_forms.BoxError as e:
        raise OutputError(str(e)) from None
    if not np.isfinite(normalized).all():
        raise OutputError(f"{plan.boxes} holds NaN or infinite values")
    if plan.box_coordinates == "normalized":
        outside = (normalized < -BOX_MARGIN) | (normalized > 1 + BOX_MARGIN)
        if outside.any():
            i = int(np.argmax(outside.any(axis=1)))
            shown = ", ".join(f"{v:g}" for v in boxes[0, kept[i]])
            raise OutputError(
                f"{plan.boxes}[{int(kept[i])}] is [{shown}], outside [0, 1]: set "
                "outputs.box_coordinates (pixels, image_info) and outputs.box_format in the "
                "model config if the boxes are not normalized "
                f"[{', '.join(plan.box_format)}]"
            )
    class_ids = classes[0, kept].astype(np.float64) + plan.class_offset
    return _detections(normalized, score[kept], class_ids, frame, labels, plan.classes)


def _map_yolo(
    outputs: Mapping[str, Tensor],
    plan: DetectionPlan,
    frame: Frame,
    options: DetectionSettings,
    labels: Labels,
) -> list[Detection]:
    assert plan.head is not None
    raw = _array(outputs, plan.head)
    if raw.ndim != 3 or raw.shape[0] < 1 or raw.shape[1] < 5:
        raise OutputError(
            f"{plan.head} has shape {list(raw.shape)}; expected [1, 4 + classes, candidates]"
        )
    head_values = raw[0].astype(np.float32, copy=False)
    if not np.isfinite(head_values).all():
        raise OutputError(f"{plan.head} holds NaN or infinite values")
    decoded = yolo.decode(
        head_values,
        min_score=options.min_score,
        nms_iou=plan.nms_iou,
        max_candidates=plan.max_candidates,
        max_detections=options.max_detections,
    )
    try:
        normalized = box_forms.normalize(decoded.boxes, "pixels", frame.sent)
    except box_forms.BoxError as e:
        raise OutputError(str(e)) from None
    class_ids = decoded.classes.astype(np.float64) + plan.class_offset
    return _detections(normalized, decoded.scores, class_ids, frame, labels, plan.head)


def _detections(
    normalized: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    frame: Frame,
    labels: Labels,
    classes_key: str,
) -> list[Detection]:
    """Detection tuples from normalized yxyx boxes of the image the model received, best
    first; boxes are clamped to the image and mapped to the displayed image."""
    found: list[Detection] = []
    names = labels.names
    width, height = frame.width, frame.height
    for i, (ymin, xmin, ymax, xmax) in enumerate(np.clip(normalized, 0.0, 1.0).tolist()):
        if frame.transform is not None:
            ymin, xmin, ymax, xmax = frame.transform((ymin, xmin, ymax, xmax))
        ymin, ymax = min(ymin, ymax), max(ymin, ymax)
        xmin, xmax = min(xmin, xmax), max(xmin, xmax)
        class_value = float(class_ids[i])
        if not 0 <= class_value <= MAX_CLASS_ID:
            raise OutputError(
                f"{classes_key}[{i}] gives class id {class_value}; class ids must be numbers "
                f"from 0 to {MAX_CLASS_ID} (set outputs.class_offset if the model counts "
                "from another base)"
            )
        class_id = round(class_value)
        box = _make(Box, (
            int(xmin * width + 0.5),
            int(ymin * height + 0.5),
            int(xmax * width + 0.5),
            int(ymax * height + 0.5),
        ))  # fmt: skip
        label = names.get(class_id) or labels.label(class_id)
        found.append(
            _make(
                Detection,
                (
                    class_id,
                    label,
                    float(scores[i]),
                    box,
                    _make(NormalizedBox, (xmin, ymin, xmax, ymax)),
                ),
            )
        )
    return found
