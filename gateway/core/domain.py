"""What a front door hands the pipeline (Request) and what it gets back (Outcome), for any
task; protobuf, JSON and MessagePack stay at the edges (gateway/frontends). A task's own
options and result are its types (gateway.tasks.types for the built-in ones).

NamedTuples: made for every image, they cost a fraction of a frozen dataclass."""

from __future__ import annotations

from typing import Any, NamedTuple

from gateway.modelref import ModelRef


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
    # Caller metadata to pass to TF Serving (trace context headers), as (key, value) pairs.
    trace: tuple[tuple[str, str], ...] = ()
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
