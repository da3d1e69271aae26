"""One batch job's parameters, as one frozen value: what it reads, where it writes, the task,
the model, the task's options and the number of shards. A pipeline job (`[pipelines.NAME]`)
has task "pipeline" and the pipeline's name as its model's, as a pipeline's own requests do;
its options are the first model's (gateway.api.pipelines.OPTIONS).

The API request converts to it, the job store's records and `OUTPUT/_batch/job.json` hold it
(as JSON), and the runner and both executors take it. `task` is the task registry's name
("detection", "classification"); `options` are the task binding's options by name (its
request message's fields, 0 meaning the model's default). The spec does not know what an
option means: its binding refuses names it does not have (Binding.request) and the task
checks the values (Task.resolve, at admission and on every image).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any

from google.protobuf.message import Message

from gateway import errors
from gateway.api import pipelines
from gateway.api.bindings import Binding, Bindings, model_spec
from gateway.domain import ModelRef
from gateway.proto.vision.v1.model_pb2 import ModelSpec

FORMATS = ("auto", "images", "manifest", "tfrecord")
MAX_SHARDS = 1000
# An option's value: a scalar field of the task's request message.
Option = int | float | str | bool


def _frozen(values: Mapping[str, Option]) -> Mapping[str, Option]:
    return MappingProxyType(dict(sorted(values.items())))


@dataclass(frozen=True)
class JobSpec:
    input: str  # a local path or fsspec URL: directory, prefix, glob, manifest or TFRecord
    output: str  # the output prefix
    task: str  # the task's name (its binding's `task`)
    model: ModelRef = field(default_factory=lambda: ModelRef(""))
    options: Mapping[str, Option] = field(default_factory=lambda: _frozen({}))
    format: str = "auto"
    shards: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", _frozen(self.options))

    def replace(self, **changes: Any) -> JobSpec:
        return replace(self, **changes)

    def binding(self, bindings: Bindings) -> Binding:
        """The task's binding (a pipeline's: gateway.api.pipelines.binding); GatewayError
        INVALID_INPUT when no task of that name is served or an option is not one of its own
        (Binding.check_options)."""
        if self.task == pipelines.TASK:
            binding: Binding = pipelines.binding(bindings)
        else:
            try:
                binding = bindings.for_task(self.task)
            except KeyError:
                names = ", ".join(b.task for b in bindings)
                raise errors.invalid_input(
                    f"task must be one of {names}, got {self.task!r}"
                ) from None
        binding.check_options(self.options)
        return binding

    def request(self, binding: Binding, image: bytes = b"", request_id: str = "") -> Message:
        """The task's request message for this job (`binding`: the task's, as `binding()`
        gives it): its model and options, with `image` and `request_id`. Every image's request
        is made here, on every transport, and admission judges the job's own (no image)."""
        return binding.request(image, self._model_spec, request_id, **self.options)

    @property
    def pipeline(self) -> str:
        """The pipeline every image runs through ("" for a task's model): a pipeline job's
        task is gateway.api.pipelines.TASK and its model's name is the pipeline's, as in
        the pipeline's own requests."""
        return self.model.name if self.task == pipelines.TASK else ""

    @cached_property
    def _model_spec(self) -> ModelSpec:
        return model_spec(self.model.name, self.model.version, self.model.label)

    def check(self) -> None:
        """GatewayError INVALID_INPUT naming the first field out of range (the task's options
        are the task's to check)."""
        if self.task == pipelines.TASK and not self.model.name:
            raise errors.invalid_input("a pipeline job names its pipeline")
        if self.pipeline and (self.model.version is not None or self.model.label is not None):
            raise errors.invalid_input(
                f"pipeline {self.pipeline!r} has no versions or labels: its steps' models are "
                "named in its config"
            )
        if self.model.version is not None and self.model.version < 1:
            raise errors.invalid_input(f"model version must be >= 1, got {self.model.version}")
        if self.model.label is not None and not self.model.label:
            raise errors.invalid_input("model label is set but empty")
        if self.format not in FORMATS:
            raise errors.invalid_input(
                f"format must be one of {', '.join(FORMATS)}, got {self.format!r}"
            )
        if not 1 <= self.shards <= MAX_SHARDS:
            raise errors.invalid_input(f"shards must be in [1, {MAX_SHARDS}], got {self.shards}")

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "format": self.format,
            "task": self.task,
            "model": self.model._asdict(),
            "options": dict(self.options),
            "shards": self.shards,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec `to_json` gave; ValueError for anything else."""
        options = data.get("options") if isinstance(data, Mapping) else None
        if not isinstance(options, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Option) for k, v in options.items()
        ):
            raise ValueError(f"not a job spec: options must map names to scalars, got {options!r}")
        try:
            return cls(
                input=str(data["input"]),
                output=str(data["output"]),
                format=str(data.get("format", "auto")),
                task=str(data["task"]),
                model=ModelRef(**data["model"]),
                options=dict(options),
                shards=int(data["shards"]),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a job spec: {e}") from None
