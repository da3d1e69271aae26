"""detection.v1 (DetectionService: Detect, DetectStream) <-> the detection task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding, page_script, served_model
from gateway.domain import Outcome
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.tasks.detection import drawing
from gateway.tasks.detection.nouns import Detections, DetectOptions

DETECTION = "detection"


def to_detection_result(outcome: Outcome) -> pb.DetectionResult:
    assert isinstance(outcome.result, Detections)
    result = pb.DetectionResult(
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=served_model(outcome),
        request_id=outcome.request_id,
    )
    # Fields set in place on messages added to the list: cheaper than building each message
    # from keyword arguments and copying it in.
    add = result.detections.add
    for found in outcome.result.detections:
        message = add(class_id=found.class_id, label=found.label, score=found.score)
        box = message.box
        box.x_min, box.y_min, box.x_max, box.y_max = found.box
        normalized = message.normalized_box
        normalized.x_min, normalized.y_min, normalized.x_max, normalized.y_max = found.normalized
    return result


BINDING = Binding(
    task=DETECTION,
    verb="detect",
    service=pb.DESCRIPTOR.services_by_name["DetectionService"],
    unary="Detect",
    stream="DetectStream",
    request_type=pb.DetectRequest,
    result_type=pb.DetectionResult,
    options_type=DetectOptions,
    to_result=to_detection_result,
    summary="Detect objects",
    options={
        "min_score": "minimum score, 0..1 (0: the model's default)",
        "max_detections": "most detections returned (0: the model's default)",
    },
    page=page_script(__file__),
    draw=drawing.draw,
)
