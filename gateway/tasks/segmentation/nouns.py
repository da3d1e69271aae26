"""The instance segmentation task's plain types: the caller's options and what it returns
for one image (the binding converts them to and from segmentation.v1 messages)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple

from gateway.models.limits import Limits
from gateway.tasks.detection.nouns import Box

RLE = "rle"
POLYGON = "polygon"
PNG = "png"
MASK_FORMATS = (RLE, POLYGON, PNG)


class SegmentOptions(NamedTuple):
    """Options as the caller gave them; 0 and "" mean the model's default."""

    min_score: Annotated[float, "minimum instance score, 0..1 (0: the model's default)"] = 0.0
    max_detections: Annotated[int, "most instances returned (0: the model's default)"] = 0
    mask_threshold: Annotated[
        float,
        "mask probability a pixel must exceed, 0..1 (0: the model's default, 0.5 unless its "
        "config says)",
    ] = 0.0
    mask_format: Annotated[
        str, 'how masks are written: "rle" (COCO compressed RLE, the default), "polygon" or "png"'
    ] = ""


class SegmentSettings(NamedTuple):
    """A request's options with the defaults filled in, and the model's ceilings on its work."""

    min_score: float
    max_detections: int
    mask_threshold: float
    mask_format: str
    limits: Limits | None = None  # None: no ceilings (tests of the mapping alone)


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


class Truncation(NamedTuple):
    """Instances left out of an answer at a limit: how many, which limit, and for a person
    what was reached and the setting that raises it."""

    left_out: int
    limit: str  # "max_mask_pixels" | "max_answer_bytes"
    message: str


@dataclass(frozen=True)
class Segments:
    instances: list[Instance]
    truncated: Truncation | None = None
