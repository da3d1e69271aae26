"""keypoints.v1 (KeypointService: DetectKeypoints, DetectKeypointsStream) <-> the keypoints
task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.keypoints.v1 import keypoints_pb2 as pb
from gateway.tasks.detection.binding import add_instance
from gateway.tasks.detection.nouns import DetectOptions
from gateway.tasks.keypoints.nouns import Keypoints

KEYPOINTS = "keypoints"


def fill_keypoints(result: pb.KeypointsResult, found: Keypoints) -> None:
    add = result.instances.add
    for instance in found.instances:
        add_point = add_instance(add, instance).keypoints.add
        for point in instance.keypoints:
            add_point(name=point.name, x=point.x, y=point.y, score=point.score)
    add_edge = result.skeleton.add
    for start, end in found.skeleton:
        add_edge(start=start, end=end)


BINDING = Binding.of(
    pb.DESCRIPTOR.services_by_name["KeypointService"],
    task=KEYPOINTS,
    verb="keypoints",
    options_type=DetectOptions,
    fill_result=fill_keypoints,
    summary="Detect keypoints",
    options={
        "min_score": "minimum instance score, 0..1 (0: the model's default)",
        "max_detections": "most instances returned (0: the model's default)",
    },
    package=__package__,
)
