"""The keypoints task's plain types: what it returns for one image (the binding converts it
to keypoints.v1 messages). The caller's options are detection's (DetectOptions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from gateway.tasks.detection.nouns import Box


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
