"""detection.v1 (DetectionService: Detect, DetectStream) <-> the detection task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.tasks.detection.nouns import Detections, DetectOptions

DETECTION = "detection"


def fill_detections(result: pb.DetectionResult, found: Detections) -> None:
    # Fields set in place on messages added to the list: cheaper than building each message
    # from keyword arguments and copying it in.
    add = result.detections.add
    for detection in found.detections:
        message = add(class_id=detection.class_id, label=detection.label, score=detection.score)
        box = message.box
        box.x_min, box.y_min, box.x_max, box.y_max = detection.box
        normalized = message.normalized_box
        normalized.x_min, normalized.y_min, normalized.x_max, normalized.y_max = (
            detection.normalized
        )


BINDING = Binding.of(
    pb.DESCRIPTOR.services_by_name["DetectionService"],
    task=DETECTION,
    verb="detect",
    options_type=DetectOptions,
    fill_result=fill_detections,
    summary="Detect objects",
    options={
        "min_score": "minimum score, 0..1 (0: the model's default)",
        "max_detections": "most detections returned (0: the model's default)",
    },
    package=__package__,
)
