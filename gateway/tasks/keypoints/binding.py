"""keypoints.v1 (KeypointService: DetectKeypoints, DetectKeypointsStream) <-> the keypoints
task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.keypoints.v1 import keypoints_pb2 as pb
from gateway.tasks.detection.binding import add_instance
from gateway.tasks.keypoints.nouns import KeypointOptions, Keypoints


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
    pb.DESCRIPTOR, KeypointOptions, fill_keypoints, summary="Detect keypoints", verb="keypoints"
)
