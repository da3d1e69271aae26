"""One batch job's parameters, as one frozen value: what it reads, where it writes, the task,
the model, the task's options and the number of shards.

The API request converts to it, the job store's records and `OUTPUT/_batch/job.json` hold it
(as JSON), and the runner and both executors take it. `task` is the task registry's name
("detection", "classification"); `options` are the task binding's options by name (its
request message's fields, 0 meaning the model's default).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gateway import errors
from gateway.api.bindings import Binding, Bindings
from gateway.modelref import ModelRef
from gateway.models import DEFAULT_TASK

FORMATS = ("auto", "images", "manifest", "tfrecord")
MAX_SHARDS = 1000
Number = int | float


def _frozen(values: Mapping[str, Number]) -> Mapping[str, Number]:
    return MappingProxyType(dict(sorted(values.items())))


@dataclass(frozen=True)
class JobSpec:
    input: str  # a local path or fsspec URL: directory, prefix, glob, manifest or TFRecord
    output: str  # the output prefix
    task: str = DEFAULT_TASK
    model: ModelRef = field(default_factory=lambda: ModelRef(""))
    options: Mapping[str, Number] = field(default_factory=lambda: _frozen({}))
    format: str = "auto"
    shards: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", _frozen(self.options))

    def replace(self, **changes: Any) -> JobSpec:
        return replace(self, **changes)

    def binding(self, bindings: Bindings) -> Binding:
        """The task's binding; GatewayError INVALID_INPUT when no task of that name is served
        or an option is not one of its own."""
        try:
            binding = bindings.for_task(self.task)
        except KeyError:
            names = ", ".join(b.task for b in bindings)
            raise errors.invalid_input(f"task must be one of {names}, got {self.task!r}") from None
        unknown = sorted(set(self.options) - set(binding.options))
        if unknown:
            raise errors.invalid_input(
                f"{', '.join(unknown)} is not an option of task {self.task} "
                f"({', '.join(binding.options)})"
            )
        return binding

    def check(self) -> None:
        """GatewayError INVALID_INPUT naming the first field out of range."""
        for name, value in self.options.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise errors.invalid_input(f"{name} must be a number, got {value!r}")
            if math.isnan(value) or value < 0:
                raise errors.invalid_input(f"{name} must be >= 0, got {value}")
        score = self.options.get("min_score", 0.0)
        if score > 1.0:
            raise errors.invalid_input(f"min_score must be in [0, 1], got {score}")
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
        try:
            return cls(
                input=str(data["input"]),
                output=str(data["output"]),
                format=str(data.get("format", "auto")),
                task=str(data["task"]),
                model=ModelRef(**data["model"]),
                options=dict(data["options"]),
                shards=int(data["shards"]),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a job spec: {e}") from None
