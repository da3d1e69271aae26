"""The instance segmentation task's plain types: the caller's options and what it returns
for one image (the binding converts them to and from segmentation.v1 messages)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from gateway.tasks.detection.nouns import Box

RLE = "rle"
POLYGON = "polygon"
PNG = "png"
MASK_FORMATS = (RLE, POLYGON, PNG)


class SegmentOptions(NamedTuple):
    """Options as the caller gave them; 0 and "" mean the model's default."""

    min_score: float = 0.0
    max_detections: int = 0
    mask_threshold: float = 0.0
    mask_format: str = ""


class SegmentSettings(NamedTuple):
    """A request's options with the defaults filled in."""

    min_score: float
    max_detections: int
    mask_threshold: float
    mask_format: str


class Mask(NamedTuple):
    """One instance's mask over the displayed image (height x width), in one form: `counts`
    (COCO compressed RLE), `polygons` ([x0, y0, x1, y1, ...] each) or `png`."""

    height: int
    width: int
    counts: str | None = None
    polygons: list[list[float]] | None = None
    png: bytes | None = None


class Instance(NamedTuple):
    class_id: int
    label: str
    score: float
    box: Box
    mask: Mask


@dataclass(frozen=True)
class Segments:
    instances: list[Instance]
