"""Recognising a detector's output form, once per model version: the signature and the model
config's `[outputs]` -> a DetectionPlan (which output is what, in which form), or BAD_MODEL
naming the config key to set when the signature leaves more than one reading."""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.domain import OutputPlan
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import described
from gateway.tasks.detection.config import DetectionConfig, DetectionOutputs
from gateway.tasks.detection.od_api import BOXES, CLASSES, NUM_DETECTIONS, SCORES
from gateway.upstream.signatures import Signature, TensorSpec

IMAGE_INFO = "image_info"  # Model Garden's [batch, 4, 2] record of its own resizing
# Output names of anchor-based raw heads (keras-hub RetinaNet's Model.export, Model Garden
# exported without its detection generator, OD API's pre-NMS tensors alone): anchor deltas
# and class logits, which need the model's anchors and box coder to decode.
RAW_HEAD_OUTPUTS = frozenset(
    {"bbox_regression", "cls_logits", "box_outputs", "cls_outputs", "raw_boxes", "raw_scores"}
)
_FLOATS = (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF, tfs.DT_BFLOAT16)
_NUMBERS = (*_FLOATS, tfs.DT_INT32, tfs.DT_INT64, tfs.DT_INT16, tfs.DT_INT8, tfs.DT_UINT8)


@dataclass(frozen=True)
class DetectionPlan(OutputPlan):
    """Which output is what for one model version, in which form (gateway.tasks.detection
    describes the forms)."""

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


def plan_outputs(signature: Signature, own: DetectionConfig) -> DetectionPlan:
    """The detection plan for `signature` with the model config's `[outputs]`; BAD_MODEL
    naming the config key to set when the signature leaves more than one reading."""
    mapping = own.outputs
    outputs = signature.outputs
    what, shown = described(signature)
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
    signature: Signature, mapping: DetectionOutputs, what: str, shown: str
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
    return yolo_plan(name, mapping)


def yolo_plan(head: str, mapping: DetectionOutputs) -> DetectionPlan:
    """The plan decoding the raw head `head` as YOLO boxes and class scores, with the
    config's NMS and class offset (for the tasks whose heads carry more per candidate too)."""
    return DetectionPlan(
        (head,),
        "yolo",
        head=head,
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
