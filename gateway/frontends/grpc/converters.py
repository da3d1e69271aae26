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
    result = pb.DetectionResult(
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=pb.ServedModel(name=outcome.model_name, version=outcome.model_version),
        request_id=outcome.request_id,
    )
    # Fields set in place on messages added to the list: about half the time of building
    # each message from keyword arguments and copying it in (measured, 5 detections).
    add = result.detections.add
    for d in outcome.result.detections:
        message = add(class_id=d.class_id, label=d.label, score=d.score)
        box = message.box
        box.x_min, box.y_min, box.x_max, box.y_max = d.box
        normalized = message.normalized_box
        normalized.x_min, normalized.y_min, normalized.x_max, normalized.y_max = d.normalized
    return result


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
