"""Plain Python types of the gateway's domain: what a front door hands the pipeline and what
it gets back. Protobuf, JSON and MessagePack stay at the edges (gateway/frontends).

All immutable. The types made for every image (requests, model references, options, outcomes
and the per-detection and per-class results) are NamedTuples: made several times per image,
they cost 0.3-0.4 µs each against 1 µs for a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class ModelRef(NamedTuple):
    """A model as a caller asks for it: a name and at most one of version or label.

    (A NamedTuple like the other per-image types: it is made, hashed and compared several
    times per image, as the key of the signature and request-envelope caches.)"""

    name: str
    version: int | None = None
    label: str | None = None

    def describe(self) -> str:
        if self.version is not None:
            return f"model '{self.name}' version {self.version}"
        if self.label is not None:
            return f"model '{self.name}' label '{self.label}'"
        return f"model '{self.name}'"


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

    min_score: float = 0.0
    max_detections: int = 0


class ClassifyOptions(NamedTuple):
    """Classification options as the caller gave them; 0 means the model's default."""

    top_k: int = 0
    min_score: float = 0.0


class Request(NamedTuple):
    """One image to run a task on, from any front door.

    `model.name` may be empty (the task's default model). `timeout` is the caller's deadline
    in seconds from now (None: no deadline; the gateway's upstream timeout still applies).
    `request_id` may be empty: the pipeline makes one. `method` names the call in metrics and
    logs (e.g. "Detect", "ClassifyStream", "POST :detect").
    """

    image: bytes
    model: ModelRef
    options: DetectOptions | ClassifyOptions
    request_id: str = ""
    timeout: float | None = None
    method: str = ""
    # Caller metadata to pass to TF Serving (trace context headers), as (key, value) pairs.
    trace: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Detections:
    detections: list[Detection]


class ScoredClass(NamedTuple):
    class_id: int  # index in the model's labels; -1 for a label the model named that is not
    label: str
    score: float


@dataclass(frozen=True)
class Classes:
    classes: list[ScoredClass]


class Outcome(NamedTuple):
    """What every task returns: its result plus the image and model that produced it."""

    result: Detections | Classes
    image_width: int
    image_height: int
    model_name: str
    model_version: int
    request_id: str
    # Time spent per stage, in seconds (decode: image to request; upstream: TF Serving).
    timings: dict[str, float]
