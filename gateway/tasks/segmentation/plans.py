"""Recognising a segmentation model's output form, once per model version: the signature and
the model config -> a SegmentationPlan, or BAD_MODEL naming the config key to set.

Form `box_masks`: detection's outputs (any form gateway.tasks.detection.plans reads) plus
box-relative mask probabilities `[batch, N, m, m]` row for row with the boxes (TF Model
Garden's and the OD API's Mask R-CNN `detection_masks`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import OutputPlan
from gateway.tasks.detection.plans import DetectionPlan, plan_outputs
from gateway.tasks.segmentation.config import SegmentationConfig
from gateway.upstream.signatures import Signature

MASKS = "detection_masks"
BOX_MASKS = "box_masks"
_FLOATS = (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF, tfs.DT_BFLOAT16)


@dataclass(frozen=True)
class SegmentationPlan(OutputPlan):
    detection: DetectionPlan | None = None
    masks: str = MASKS

    def describe(self) -> dict[str, object]:
        assert self.detection is not None
        return {
            **self.detection.describe(),
            "masks": f"{self.masks} (box-relative [batch, N, m, m] probabilities, pasted "
            "into each box)",
        }


def plan_segmentation(signature: Signature, config: SegmentationConfig) -> SegmentationPlan:
    what = f"model '{signature.model}' version {signature.version}"
    shown = f"its '{signature.name}' signature has {signature.describe()}"
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
    detection = plan_outputs(signature, config.detection.outputs)
    return SegmentationPlan(
        (*detection.output_filter, name), BOX_MASKS, detection=detection, masks=name
    )
