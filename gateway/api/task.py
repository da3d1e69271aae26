"""What a task declares, so the pipeline, the doors and the model config can run it
without knowing it: the contract between the core and a task, as a binding
(gateway.api.bindings) is the contract between a door and a task.

A task (detection, classification, ...) is a folder, gateway/tasks/<task>/ (registered by
one line in gateway.tasks.builtin); it says:
- its public API (`binding`: gRPC service, messages <-> its plain types, HTTP verb, page);
- its own model-config keys (`read_config`: request defaults, `[models.NAME.outputs]`),
  refusing unknown ones by name; the result is the model's `ModelConfig.task_config`;
- which outputs it needs from a signature and which it asks TF Serving for (`output_plan`),
  refusing signatures it cannot use with a message that shows the signature;
- how request options are checked and completed with the model's defaults, else the
  gateway's (`resolve`), and which gateway-wide defaults it has (`request_defaults`: each an
  operator flag, --min-score for detection);
- how the outputs of one image become its result (`map`), refusing outputs that do not have
  the shapes, types or ranges it needs (OutputError);
- what a request's work costs before it runs (`cost`: pixels decoded, mask pixels, answer
  bytes, from the image header, the plan and the resolved options, which hold the model's
  ceilings), so the pipeline can refuse or count it;
- how a shadow candidate's result compares with the current one's (`compare`);
- what the request log says about a result (`summary`);
- the instances a result holds, when it finds some (`instances`), for a pipeline's steps.

The image input is not the task's business: gateway.core.inputs reads it from the signature
and the model config, the same for every task. The app builds a `TaskRegistry` of the tasks
it serves and gives it to the pipeline: nothing below the app names a task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from gateway.api.bindings import Binding, Bindings
from gateway.domain import Comparison, Cost, Frame, Located, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import RequestDefault, Rules
from gateway.upstream.signatures import Signature
from gateway.upstream.tensors import Tensor


class Task(Protocol):
    name: str  # as in the model config: "detection", "classification"
    binding: Binding  # its public API
    # True when mapping one image's outputs may take milliseconds (masks: a bitmap per
    # instance): the pipeline then runs `map` in map threads of their own, off the event loop
    # and apart from the decode threads, and `frame.work.check()` between instances stops it
    # at the request's deadline; False keeps it inline (a few µs of Python per image).
    map_in_thread: bool
    # True when its results hold instances (`instances`): it may start a pipeline.
    finds_instances: bool
    # The gateway-wide defaults its `resolve` reads (rules.default(...)), each a flag and a
    # GATEWAY_* variable of the gateway (gateway.flags); tasks may share one (the same value).
    request_defaults: Sequence[RequestDefault]

    def read_config(self, table: Mapping[str, Any], path: Path, where: str) -> Any:
        """[models.NAME] of the model config file at `path` (`where` is "models.NAME"): the
        task's own keys read into its config (defaults filled in); the keys every model
        shares (gateway.models.values.COMMON_KEYS) are read by gateway.models; any other key
        is refused with ModelConfigError naming it. {} gives the task's defaults."""
        ...

    def resolve(
        self, options: Any, config: ModelConfig, rules: Rules
    ) -> Any:  # the task's resolved options
        """Checks the caller's options (GatewayError INVALID_INPUT) and fills in defaults: the
        model's config's, else the gateway's (`rules`, with the model's ceilings)."""
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

    def cost(self, options: Any, frame: Frame, plan: OutputPlan, config: ModelConfig) -> Cost:
        """The most one image's work may take (`options` resolved, `frame` the image's size
        from its header, before decoding): what the model's limits bound and the caller's
        fair share counts. Cheap (no decoding), and never below what `map` may spend."""
        ...

    def compare(self, current: Any, candidate: Any) -> Comparison:
        """A shadow candidate's result for one image against the current model's, in the
        task's terms; runs in a worker thread, bounded by the results' sizes (which the
        model's limits bound): vectorised, milliseconds for a thousand items a side."""
        ...

    def summary(self, result: Any) -> dict[str, object]:
        """Fields for the request log line."""
        ...

    def instances(self, result: Any) -> Sequence[Located] | None:
        """The instances a result holds, in its order, for a pipeline's later steps to crop
        (gateway.core.cascade); None for a task that finds none (it cannot start one)."""
        ...


class TaskRegistry(Mapping[str, Task]):
    """The tasks the gateway serves, by name (as a model config's `task` names them)."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            if task.name in self._tasks:
                raise ValueError(f"two tasks are named {task.name!r}")
            self._tasks[task.name] = task
        if not self._tasks:
            raise ValueError("a gateway serves at least one task")

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
    def default(self) -> str:
        """The task of a model no config file lists: the first registered (detection, for
        the built-in tasks, as the gateway began)."""
        return next(iter(self._tasks))

    @property
    def config_readers(self) -> dict[str, Callable[[Mapping[str, Any], Path, str], Any]]:
        """Each task's reader of its model-config keys, by name (for gateway.models)."""
        return {name: task.read_config for name, task in self._tasks.items()}

    @property
    def bindings(self) -> Bindings:
        """The tasks' public APIs, for the doors, the client and batch."""
        return Bindings(task.binding for task in self._tasks.values())
