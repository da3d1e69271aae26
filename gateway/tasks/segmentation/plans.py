"""Recognising a segmentation model's output form, once per model version: the signature and
the model config -> a SegmentationPlan, or BAD_MODEL naming the config key to set.

Forms:
- `box_masks`: detection's outputs (any form gateway.tasks.detection.plans reads) plus
  box-relative mask probabilities `[batch, N, m, m]` row for row with the boxes (TF Model
  Garden's and the OD API's Mask R-CNN `detection_masks`);
- `yolo-seg`: a YOLOv8/11-seg raw head `[batch, 4 + classes + M, candidates]` (per candidate
  cx, cy, w, h in pixels of the image sent, a score per class, then M mask coefficients) and
  its prototypes `[batch, M, h, w]` or `[batch, h, w, M]` over the image sent (Ultralytics'
  Segment head, ultralytics/nn/modules/head.py; the layout is read per request from the
  shapes: gateway.tasks.decoders.yoloseg)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.domain import OutputPlan
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import described
from gateway.tasks.detection.plans import DetectionPlan, plan_outputs, yolo_plan
from gateway.tasks.segmentation.config import NATIVE, YOLO_SEG, SegmentationConfig
from gateway.upstream.signatures import Signature, TensorSpec

MASKS = "detection_masks"
BOX_MASKS = "box_masks"
_FLOATS = (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF, tfs.DT_BFLOAT16)


@dataclass(frozen=True)
class SegmentationPlan(OutputPlan):
    detection: DetectionPlan | None = None
    masks: str = MASKS
    prototypes: str = ""  # yolo-seg's (its head is detection.head)
    mask_resolution: str = NATIVE  # yolo-seg's: "native" or "input"

    def describe(self) -> dict[str, object]:
        assert self.detection is not None
        if self.form == YOLO_SEG:
            return {
                "form": "yolo-seg raw head [batch, 4 + classes + M, candidates] and "
                "prototypes [batch, M, h, w] or [batch, h, w, M]",
                "head": self.detection.head,
                "prototypes": self.prototypes,
                "nms": f"class-wise, IoU {self.detection.nms_iou}, at most "
                f"{self.detection.max_candidates} candidates after min_score",
                "masks": "coefficients x prototypes (logits), upsampled to the image, kept in "
                "the box (native, Ultralytics' retina_masks)"
                if self.mask_resolution == NATIVE
                else "coefficients x prototypes (logits), upsampled to the input the model "
                "received, kept in the box there, then scaled to the image (input, "
                "Ultralytics' predictor default)",
            }
        return {
            **self.detection.describe(),
            "masks": f"{self.masks} (box-relative [batch, N, m, m] probabilities, pasted "
            "into each box)",
        }


def plan_segmentation(signature: Signature, config: SegmentationConfig) -> SegmentationPlan:
    what, shown = described(signature)
    if config.decoder == YOLO_SEG:
        return _yolo_seg(signature, config, what, shown)
    outputs = signature.outputs
    name = config.masks or MASKS
    if name not in outputs:
        if config.masks is not None:
            raise errors.bad_model(
                f"the model config says outputs.masks = '{name}' but {what} has no such "
                f"output: {shown}"
            )
        raise errors.bad_model(
            f"{what} has no '{MASKS}' output for instance segmentation: {shown}; name its "
            "box-relative mask output [batch, N, m, m] with outputs.masks in the model config "
            "(and its detection outputs as for detection)"
        )
    spec = outputs[name]
    if spec.dtype not in _FLOATS or (spec.shape is not None and len(spec.shape) != 4):
        raise errors.bad_model(
            f"{what}: output '{name}' is {spec.describe()}; masks must be float "
            "[batch, N, m, m] probabilities of each box's pixels"
        )
    detection = plan_outputs(signature, config.detection)
    return SegmentationPlan(
        (*detection.output_filter, name), BOX_MASKS, detection=detection, masks=name
    )


def _yolo_seg(
    signature: Signature, config: SegmentationConfig, what: str, shown: str
) -> SegmentationPlan:
    outputs = signature.outputs
    picked: dict[str, str] = {}
    for key, rank, wanted in (
        ("predictions", 3, "the raw head [batch, 4 + classes + M, candidates]"),
        ("prototypes", 4, "the prototypes [batch, M, h, w] or [batch, h, w, M]"),
    ):
        named = getattr(config, key)
        if named is not None:
            if named not in outputs:
                raise errors.bad_model(
                    f"the model config says outputs.{key} = '{named}' but {what} has no such "
                    f"output: {shown}"
                )
            picked[key] = named
            continue
        fitting = [name for name, spec in outputs.items() if _float_of_rank(spec, rank)]
        if len(fitting) != 1:
            raise errors.bad_model(
                f"the model config says outputs.decoder = '{YOLO_SEG}' but {shown}; name "
                f"{wanted} with outputs.{key}"
            )
        picked[key] = fitting[0]
    for key, rank in (("predictions", 3), ("prototypes", 4)):
        spec = outputs[picked[key]]
        if not _float_of_rank(spec, rank):
            raise errors.bad_model(
                f"{what}'s output '{picked[key]}' ({key}) is {spec.describe()}; decoder = "
                f"'{YOLO_SEG}' needs a float head [batch, 4 + classes + M, candidates] and "
                "float prototypes [batch, M, h, w] or [batch, h, w, M] (an Ultralytics "
                "segmentation export with nms=False)"
            )
    head = picked["predictions"]
    return SegmentationPlan(
        (head, picked["prototypes"]),
        YOLO_SEG,
        detection=yolo_plan(head, config.detection.outputs),
        prototypes=picked["prototypes"],
        mask_resolution=config.mask_resolution,
    )


def _float_of_rank(spec: TensorSpec, rank: int) -> bool:
    return spec.dtype in _FLOATS and (spec.shape is None or len(spec.shape) == rank)
