"""The shared nouns, on the ground floor: what a front door hands the pipeline (Request), what
it gets back (Outcome), the model a caller names (ModelRef), the image as the caller sees it
(Frame), which outputs a task reads (OutputPlan). Every floor above uses them; this module
imports nothing else of the gateway, so no arrow of the import graph runs back up to it.

Protobuf, JSON and MessagePack stay at the edges (gateway/frontends, gateway/api); a task's
own options and result are its nouns (gateway/tasks/<task>/nouns.py).

NamedTuples for what is made per image: they cost a fraction of a frozen dataclass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

# Caller metadata passed on to TF Serving (trace context headers), as (key, value) pairs.
Trace = tuple[tuple[str, str], ...]

# (ymin, xmin, ymax, xmax) normalized box of the image the model saw -> the same box
# normalized to the displayed image (EXIF orientation applied).
BoxTransform = Callable[[tuple[float, float, float, float]], tuple[float, float, float, float]]


class ModelRef(NamedTuple):
    """A model as a caller asks for it: a name and at most one of version or label.

    A NamedTuple: it is made, hashed and compared several times per image, as the key of
    the signature and request-envelope caches."""

    name: str
    version: int | None = None
    label: str | None = None

    def describe(self) -> str:
        if self.version is not None:
            return f"model '{self.name}' version {self.version}"
        if self.label is not None:
            return f"model '{self.name}' label '{self.label}'"
        return f"model '{self.name}'"


class Request(NamedTuple):
    """One image to run a task on, from any front door.

    `model.name` may be empty (the task's default model). `timeout` is the caller's deadline
    in seconds from now (None: no deadline; the gateway's upstream timeout still applies).
    `request_id` may be empty: the pipeline makes one. `method` names the call in metrics and
    logs (e.g. "Detect", "ClassifyStream", "POST :detect").
    """

    image: bytes
    model: ModelRef
    options: Any  # the task's options (e.g. DetectOptions), as the binding made them
    request_id: str = ""
    timeout: float | None = None
    method: str = ""
    # Caller metadata to pass to TF Serving (trace context headers).
    trace: Trace = ()
    # Who is calling (gateway.identity), for its quota and fair share (gateway.policy);
    # "" is the gateway's own work (in-process batch jobs).
    caller: str = ""


class Outcome(NamedTuple):
    """What every task returns: its result plus the image and model that produced it."""

    result: Any  # the task's result (e.g. Detections)
    image_width: int
    image_height: int
    model_name: str
    model_version: int
    request_id: str
    # Time spent per stage, in seconds (decode: image to request; upstream: TF Serving).
    timings: dict[str, float]


class Frame(NamedTuple):
    """The image as the caller sees it, and how the model's view of it maps back."""

    width: int
    height: int
    transform: BoxTransform | None = None  # None: the model saw the displayed image
    sent: tuple[int, int] | None = None  # (width, height) of the image the model received


@dataclass(frozen=True)
class OutputPlan:
    """Which outputs a task reads from one model version (and asks TF Serving for)."""

    output_filter: tuple[str, ...]
    form: str = ""  # the task's name for the output form it found (e.g. "logits")


class OutputError(ValueError):
    """Model outputs that do not have the shapes, types or value ranges the task needs."""
