"""Plain Python types of the gateway's domain; protobuf stays at the edges (service.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelRef:
    """A model as a caller asks for it: a name and at most one of version or label."""

    name: str
    version: int | None = None
    label: str | None = None

    def describe(self) -> str:
        if self.version is not None:
            return f"model '{self.name}' version {self.version}"
        if self.label is not None:
            return f"model '{self.name}' label '{self.label}'"
        return f"model '{self.name}'"


@dataclass(frozen=True)
class Box:
    """Pixel box of the displayed image; min inclusive, max exclusive."""

    x_min: int
    y_min: int
    x_max: int
    y_max: int


@dataclass(frozen=True)
class NormalizedBox:
    """Box as fractions of the displayed image's width (x) and height (y)."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float


@dataclass(frozen=True)
class Detection:
    class_id: int
    label: str
    score: float
    box: Box
    normalized: NormalizedBox


@dataclass(frozen=True)
class DetectionOutcome:
    """Everything a DetectionResult carries."""

    detections: list[Detection]
    image_width: int
    image_height: int
    model_name: str
    model_version: int
    request_id: str
