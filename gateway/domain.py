"""The shared nouns, on the ground floor: what a front door hands the pipeline (Request), what
it gets back (Outcome), the model a caller names (ModelRef), the image as the caller sees it
(Frame), which outputs a task reads (OutputPlan), what a request's work costs before it runs
(Cost), the running work its deadline stops (Work), how a shadow answer compared with
the caller's (Comparison), and a pipeline's answer (Tree: the first model's instances, each
with what the later steps found in its crop). Every floor above uses them; this module
imports nothing else of the gateway, so no arrow of the import graph runs back up to it.

Protobuf, JSON and MessagePack stay at the edges (gateway/frontends, gateway/api); a task's
own options and result are its nouns (gateway/tasks/<task>/nouns.py).

NamedTuples for what is made per image: they cost a fraction of a frozen dataclass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

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


class Cost(NamedTuple):
    """One image's work, priced before it runs (Task.cost, from the image header, the plan
    and the resolved options): the most each part may take, which the model's limits
    ([models.NAME.limits]) bound and each caller's fair share counts (gateway.policy)."""

    pixels: int = 0  # pixels decoded (the image's, from its header)
    mask_pixels: int = 0  # mask pixels pasted at most (instances x box pixels)
    answer_bytes: int = 0  # bytes the answer may hold at most
    items: int = 0  # instances, classes or values the answer holds at most

    @property
    def units(self) -> float:
        """Work units: megapixels decoded or pasted plus megabytes of answer written, each
        about 20-70 ms of one core (bench/results.md, "Work priced before it runs")."""
        return (self.pixels + self.mask_pixels + self.answer_bytes) / 1e6


class Stopped(Exception):
    """The work was stopped: its deadline passed (`deadline` True) or its caller went away."""

    def __init__(self, deadline: bool) -> None:
        super().__init__("the call's deadline passed" if deadline else "the call was cancelled")
        self.deadline = deadline


class Work:
    """One request's running work: its deadline (time.monotonic(); None: none) and whether its
    caller went away, which work in a thread checks between instances and strips
    (`check`, microseconds) so it stops within ~100 ms and frees its core; and what it spent
    (mask pixels pasted, answer bytes written) for the caller's fair share."""

    __slots__ = ("answer_bytes", "cancelled", "deadline", "mask_pixels")

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self.cancelled = False  # set on the event loop, read in a thread: one bool
        self.mask_pixels = 0
        self.answer_bytes = 0

    def check(self) -> None:
        """Raises Stopped when the caller went away or the deadline passed."""
        if self.cancelled:
            raise Stopped(False)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise Stopped(True)


class Frame(NamedTuple):
    """The image as the caller sees it, and how the model's view of it maps back; `work` is
    the request's running work (heavy mapping checks its deadline: Work.check)."""

    width: int
    height: int
    transform: BoxTransform | None = None  # None: the model saw the displayed image
    sent: tuple[int, int] | None = None  # (width, height) of the image the model received
    work: Work | None = None


class Located(Protocol):
    """An instance a task found (a detection, a segmented or a posed instance): what a
    pipeline's later steps crop and filter by (gateway.core.cascade). `box` is in the
    caller's pixels: (x_min, y_min, x_max, y_max), min inclusive, max exclusive."""

    @property
    def class_id(self) -> int: ...

    @property
    def label(self) -> str: ...

    @property
    def score(self) -> float: ...

    @property
    def box(self) -> tuple[int, int, int, int]: ...


class Comparison(NamedTuple):
    """A shadow candidate's answer for one image compared with the current model's, in the
    task's terms (Task.compare): named measures in [0, 1] (1: the same answer; e.g. detection's
    precision and recall, classification's top1_agreement), and per matched pair the
    candidate's score minus the current's."""

    task: str
    measures: Mapping[str, float]
    score_deltas: tuple[float, ...] = ()


@dataclass(frozen=True)
class OutputPlan:
    """Which outputs a task reads from one model version (and asks TF Serving for)."""

    output_filter: tuple[str, ...]
    form: str = ""  # the task's name for the output form it found (e.g. "logits")


class OutputError(ValueError):
    """Model outputs that do not have the shapes, types or value ranges the task needs."""


class StepAnswer(NamedTuple):
    """What one step answered for one crop: the step model's outcome, or the crop's error."""

    parent: int  # the first step's instance
    step: str
    crop: tuple[int, int, int, int]  # (x_min, y_min, x_max, y_max) in the caller's pixels
    outcome: Outcome | None
    error: Exception | None  # a GatewayError (gateway.errors)


@dataclass
class StepSummary:
    name: str
    task: str  # the step model's task
    model: tuple[str, int] | None = None  # (name, version) that answered
    crops: int = 0
    failed: int = 0
    skipped: dict[str, list[int]] = field(default_factory=dict)  # reason -> instance ids


@dataclass(frozen=True)
class Tree:
    """A pipeline's answer for one image (the Outcome.result of gateway.core.cascade)."""

    pipeline: str
    first_task: str
    first: Any  # the first model's result (its task's)
    attached: list[dict[str, StepAnswer]]  # per first-step instance: step name -> answer
    steps: list[StepSummary]
