"""keypoints.v1 (KeypointService: DetectKeypoints, DetectKeypointsStream) <-> the keypoints
task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding, page_script, served_model
from gateway.domain import Outcome
from gateway.proto.keypoints.v1 import keypoints_pb2 as pb
from gateway.tasks.detection.nouns import DetectOptions
from gateway.tasks.keypoints import drawing
from gateway.tasks.keypoints.nouns import Keypoints

KEYPOINTS = "keypoints"


def to_keypoints_result(outcome: Outcome) -> pb.KeypointsResult:
    assert isinstance(outcome.result, Keypoints)
    result = pb.KeypointsResult(
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=served_model(outcome),
        request_id=outcome.request_id,
    )
    add = result.instances.add
    for found in outcome.result.instances:
        message = add(class_id=found.class_id, label=found.label, score=found.score)
        box = message.box
        box.x_min, box.y_min, box.x_max, box.y_max = found.box
        add_point = message.keypoints.add
        for point in found.keypoints:
            add_point(name=point.name, x=point.x, y=point.y, score=point.score)
    add_edge = result.skeleton.add
    for start, end in outcome.result.skeleton:
        add_edge(start=start, end=end)
    return result


BINDING = Binding(
    task=KEYPOINTS,
    verb="keypoints",
    service=pb.DESCRIPTOR.services_by_name["KeypointService"],
    unary="DetectKeypoints",
    stream="DetectKeypointsStream",
    request_type=pb.DetectKeypointsRequest,
    result_type=pb.KeypointsResult,
    options_type=DetectOptions,
    to_result=to_keypoints_result,
    summary="Detect keypoints",
    options={
        "min_score": "minimum instance score, 0..1 (0: the model's default)",
        "max_detections": "most instances returned (0: the model's default)",
    },
    page=page_script(__file__),
    draw=drawing.draw,
)
