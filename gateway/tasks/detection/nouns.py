"""The detection task's nouns: the options a caller gives (DetectOptions) and the result it
gets (Detections of Detection, each with a pixel Box and a NormalizedBox); the binding
converts them to and from detection.v1 messages. Segmentation and keypoints reuse Box and
DetectOptions.

NamedTuples for the values made several times per image (a NamedTuple costs a fraction of
a frozen dataclass to make).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple, Protocol


class Box(NamedTuple):
    """Pixel box of the displayed image; min inclusive, max exclusive."""

    x_min: int
    y_min: int
    x_max: int
    y_max: int


class NormalizedBox(NamedTuple):
    """Box as fractions of the displayed image's width (x) and height (y)."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float


class Detection(NamedTuple):
    class_id: int
    label: str
    score: float
    box: Box
    normalized: NormalizedBox


class DetectOptions(NamedTuple):
    """Detection options as the caller gave them; 0 means the model's default."""

    min_score: Annotated[float, "minimum score, 0..1 (0: the model's default)"] = 0.0
    max_detections: Annotated[int, "most detections returned (0: the model's default)"] = 0


class DetectionSettings(NamedTuple):
    """A request's detection options with the defaults filled in."""

    min_score: float
    max_detections: int


class Kept(Protocol):
    """What decides which instances a request keeps: DetectionSettings, and the resolved
    options of the tasks built on detection."""

    @property
    def min_score(self) -> float: ...

    @property
    def max_detections(self) -> int: ...


@dataclass(frozen=True)
class Detections:
    detections: list[Detection]
