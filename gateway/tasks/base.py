"""What a task declares, so the pipeline, the doors and the model config can run it
without knowing it.

A task (detection, classification, ...) is a folder, gateway/tasks/<task>/ (registered by
one line in gateway.tasks.builtin); it says:
- its public API (`binding`: gRPC service, messages <-> its plain types, HTTP verb, page);
- its own model-config keys (`read_config`: request defaults, `[models.NAME.outputs]`),
  refusing unknown ones by name; the result is the model's `ModelConfig.task_config`;
- which outputs it needs from a signature and which it asks TF Serving for (`output_plan`),
  refusing signatures it cannot use with a message that shows the signature;
- how request options are checked and completed with the model's defaults (`resolve`);
- how the outputs of one image become its result (`map`), refusing outputs that do not have
  the shapes, types or ranges it needs (OutputError);
- what the request log says about a result (`summary`).

The image input is not the task's business: gateway.core.inputs reads it from the signature
and the model config, the same for every task. The app builds a `TaskRegistry` of the tasks
it serves and gives it to the pipeline: nothing below the app names a task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from gateway.api.bindings import Binding, Bindings
from gateway.config import Settings
from gateway.models import ModelConfig
from gateway.upstream.signatures import Signature
from gateway.upstream.tensors import Tensor

# (ymin, xmin, ymax, xmax) normalized box of the image the model saw -> the same box
# normalized to the displayed image (EXIF orientation applied).
BoxTransform = Callable[[tuple[float, float, float, float]], tuple[float, float, float, float]]

# Distinct (model, version) pairs whose bad outputs have been logged; bounded because model
# names come from clients (unknown ones fail earlier, but stay safe).
_MAX_REPORTED = 1024

log = logging.getLogger("gateway.tasks")


class OutputError(ValueError):
    """Model outputs that do not have the shapes, types or value ranges the task needs."""


@dataclass(frozen=True)
class OutputPlan:
    """Which outputs a task reads from one model version (and asks TF Serving for)."""

    output_filter: tuple[str, ...]
    form: str = ""  # the task's name for the output form it found (e.g. "logits")


class Frame(NamedTuple):
    """The image as the caller sees it, and how the model's view of it maps back."""

    width: int
    height: int
    transform: BoxTransform | None = None  # None: the model saw the displayed image
    sent: tuple[int, int] | None = None  # (width, height) of the image the model received


class Task(Protocol):
    name: str  # as in the model config: "detection", "classification"
    binding: Binding  # its public API
    # True when mapping one image's outputs may take milliseconds (masks: a bitmap per
    # instance): the pipeline then runs `map` in its decode threads, off the event loop that
    # answers every other request; False keeps it inline (a few µs of Python per image).
    map_in_thread: bool

    def read_config(self, table: Mapping[str, Any], path: Path, where: str) -> Any:
        """[models.NAME] of the model config file at `path` (`where` is "models.NAME"): the
        task's own keys read into its config (defaults filled in); the keys every model
        shares (gateway.models.values.COMMON_KEYS) are read by gateway.models; any other key
        is refused with ModelConfigError naming it. {} gives the task's defaults."""
        ...

    def resolve(
        self, options: Any, config: ModelConfig, settings: Settings
    ) -> Any:  # the task's resolved options
        """Checks the caller's options (GatewayError INVALID_INPUT) and fills in defaults."""
        ...

    def output_plan(self, signature: Signature, config: ModelConfig) -> OutputPlan:
        """The outputs to read, or GatewayError BAD_MODEL naming what is missing."""
        ...

    def map(
        self,
        outputs: Mapping[str, Tensor],
        plan: OutputPlan,
        frame: Frame,
        options: Any,
        config: ModelConfig,
    ) -> Any:
        """The result for one image (the task's own plain type); OutputError when the outputs
        are unusable. `outputs` are TF Serving's (gateway.upstream.tensors.OutputTensor,
        decoded on demand) or arrays."""
        ...

    def summary(self, result: Any) -> dict[str, object]:
        """Fields for the request log line."""
        ...


_Config = TypeVar("_Config")


def task_config(config: ModelConfig, default: _Config) -> _Config:
    """A task's own config of a model (`ModelConfig.task_config`, as its read_config made
    it), or `default` for a model no config file lists (task_config None)."""
    own = config.task_config
    return own if isinstance(own, type(default)) else default


class TaskRegistry(Mapping[str, Task]):
    """The tasks the gateway serves, by name (as a model config's `task` names them)."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            if task.name in self._tasks:
                raise ValueError(f"two tasks are named {task.name!r}")
            self._tasks[task.name] = task

    def __getitem__(self, name: str) -> Task:
        return self._tasks[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tasks)

    @property
    def config_readers(self) -> dict[str, Callable[[Mapping[str, Any], Path, str], Any]]:
        """Each task's reader of its model-config keys, by name (for gateway.models)."""
        return {name: task.read_config for name, task in self._tasks.items()}

    @property
    def bindings(self) -> Bindings:
        """The tasks' public APIs, for the doors, the client and batch."""
        return Bindings(task.binding for task in self._tasks.values())


class BadOutputLog:
    """Logs a model version's unusable outputs once, not once per request."""

    def __init__(self) -> None:
        self._reported: set[tuple[str, int]] = set()

    def report(self, model: str, version: int, problem: str) -> bool:
        """Logs a warning the first time `model` `version` gives bad outputs; True if logged."""
        key = (model, version)
        if key in self._reported or len(self._reported) >= _MAX_REPORTED:
            return False
        self._reported.add(key)
        log.warning(
            "model outputs are unusable; requests to this version fail with "
            "FAILED_PRECONDITION (logged once per model version)",
            extra={"fields": {"model": model, "version": version, "problem": problem}},
        )
        return True


BAD_OUTPUTS = BadOutputLog()
