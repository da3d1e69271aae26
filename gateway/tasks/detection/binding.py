"""detection.v1 (DetectionService: Detect, DetectStream) <-> the detection task's plain types."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gateway.api.bindings import Binding
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.tasks.detection.nouns import Box, Detections, DetectOptions


class Instance(Protocol):
    @property
    def class_id(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def box(self) -> Box: ...


def add_instance(add: Callable[..., Any], found: Instance) -> Any:
    """The message `add` appends to a result's list, holding the class, label, score and
    pixel box of an instance (detection's, or a task's built on it). Fields set in place on
    messages added to the list: cheaper than building each message from keyword arguments
    and copying it in."""
    message = add(class_id=found.class_id, label=found.label, score=found.score)
    box = message.box
    box.x_min, box.y_min, box.x_max, box.y_max = found.box
    return message


def fill_detections(result: pb.DetectionResult, found: Detections) -> None:
    add = result.detections.add
    for detection in found.detections:
        normalized = add_instance(add, detection).normalized_box
        normalized.x_min, normalized.y_min, normalized.x_max, normalized.y_max = (
            detection.normalized
        )


BINDING = Binding.of(pb.DESCRIPTOR, DetectOptions, fill_detections, summary="Detect objects")
