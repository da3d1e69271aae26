"""The public API's protobuf messages <-> the gateway's plain Python types."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway import errors
from gateway.config import Settings
from gateway.domain import DetectionOutcome, ModelRef
from gateway.proto.detection.v1 import detection_pb2 as pb


@dataclass(frozen=True)
class Query:
    """A validated DetectRequest with the server defaults filled in."""

    image: bytes
    model: ModelRef
    min_score: float
    max_detections: int


def to_query(request: pb.DetectRequest, settings: Settings) -> Query:
    """Raises GatewayError (INVALID_ARGUMENT) for out-of-range fields."""
    if math.isnan(request.min_score) or not 0.0 <= request.min_score <= 1.0:
        raise errors.invalid_argument(
            f"min_score must be in [0, 1] (0 means the server default {settings.min_score}), "
            f"got {request.min_score}"
        )
    if request.max_detections < 0:
        raise errors.invalid_argument(
            f"max_detections must be >= 0 (0 means the server default "
            f"{settings.max_detections}), got {request.max_detections}"
        )
    spec = request.model
    choice = spec.WhichOneof("version_choice")
    if choice == "version" and spec.version <= 0:
        raise errors.invalid_argument(
            f"model.version must be a positive version number, got {spec.version}; "
            "leave it unset for the latest version"
        )
    if choice == "label" and not spec.label:
        raise errors.invalid_argument(
            "model.label is set but empty; leave it unset or name a label"
        )
    model = ModelRef(
        name=spec.name or settings.model,
        version=spec.version if choice == "version" else None,
        label=spec.label if choice == "label" else None,
    )
    return Query(
        image=request.image,
        model=model,
        min_score=request.min_score or settings.min_score,
        max_detections=request.max_detections or settings.max_detections,
    )


def to_result(outcome: DetectionOutcome) -> pb.DetectionResult:
    return pb.DetectionResult(
        detections=[
            pb.Detection(
                class_id=d.class_id,
                label=d.label,
                score=d.score,
                box=pb.BoundingBox(
                    x_min=d.box.x_min, y_min=d.box.y_min, x_max=d.box.x_max, y_max=d.box.y_max
                ),
                normalized_box=pb.NormalizedBox(
                    x_min=d.normalized.x_min,
                    y_min=d.normalized.y_min,
                    x_max=d.normalized.x_max,
                    y_max=d.normalized.y_max,
                ),
            )
            for d in outcome.detections
        ],
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=pb.ServedModel(name=outcome.model_name, version=outcome.model_version),
        request_id=outcome.request_id,
    )
