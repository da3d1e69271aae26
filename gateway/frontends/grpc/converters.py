"""The public API's protobuf messages <-> the pipeline's plain Python types.

Conversion only: the pipeline checks values and fills in defaults (0 means "default").
"""

from __future__ import annotations

from google.rpc import status_pb2

from gateway.core.domain import (
    Classes,
    ClassifyOptions,
    Detections,
    DetectOptions,
    ModelRef,
    Outcome,
    Request,
)
from gateway.errors import GatewayError
from gateway.frontends.grpc.status import STATUS
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.detection.v1 import detection_pb2 as pb

Trace = tuple[tuple[str, str], ...]


def to_model_ref(spec: pb.ModelSpec) -> ModelRef:
    choice = spec.WhichOneof("version_choice")
    return ModelRef(
        name=spec.name,
        version=spec.version if choice == "version" else None,
        label=spec.label if choice == "label" else None,
    )


def to_detect(
    request: pb.DetectRequest, request_id: str, method: str, timeout: float | None, trace: Trace
) -> Request:
    options = DetectOptions(request.min_score, request.max_detections)
    return Request(
        request.image, to_model_ref(request.model), options, request_id, timeout, method, trace
    )


def to_classify(
    request: cpb.ClassifyRequest, request_id: str, method: str, timeout: float | None, trace: Trace
) -> Request:
    options = ClassifyOptions(request.top_k, request.min_score)
    return Request(
        request.image, to_model_ref(request.model), options, request_id, timeout, method, trace
    )


def to_detection_result(outcome: Outcome) -> pb.DetectionResult:
    assert isinstance(outcome.result, Detections)
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
            for d in outcome.result.detections
        ],
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=pb.ServedModel(name=outcome.model_name, version=outcome.model_version),
        request_id=outcome.request_id,
    )


def to_classification_result(outcome: Outcome) -> cpb.ClassificationResult:
    assert isinstance(outcome.result, Classes)
    return cpb.ClassificationResult(
        classes=[
            cpb.ScoredClass(class_id=c.class_id, label=c.label, score=c.score)
            for c in outcome.result.classes
        ],
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=pb.ServedModel(name=outcome.model_name, version=outcome.model_version),
        request_id=outcome.request_id,
    )


def to_status(error: GatewayError) -> status_pb2.Status:
    """A per-image error for a stream result (google.rpc.Status; codes as gRPC's)."""
    return status_pb2.Status(code=STATUS[error.kind].value[0], message=error.message)
