"""The keypoints task's plain types: what it returns for one image (the binding converts it
to keypoints.v1 messages), and the caller's options (detection's, of instances)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple

from gateway.tasks.detection.nouns import Box


class KeypointOptions(NamedTuple):
    """Options as the caller gave them; 0 means the model's default."""

    min_score: Annotated[float, "minimum instance score, 0..1 (0: the model's default)"] = 0.0
    max_detections: Annotated[int, "most instances returned (0: the model's default)"] = 0


class Keypoint(NamedTuple):
    name: str
    x: float  # pixels of the displayed image, not rounded
    y: float
    score: float


class Instance(NamedTuple):
    class_id: int
    label: str
    score: float
    box: Box
    keypoints: list[Keypoint]


@dataclass(frozen=True)
class Keypoints:
    instances: list[Instance]
    skeleton: tuple[tuple[int, int], ...]  # pairs of indices into each instance's keypoints
