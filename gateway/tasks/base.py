"""What the task folders share: `FolderTask`, the members every task has alike (its name,
binding and config module from its folder, its own config of a model, its output plan from
its plans function), the readers of a model table's own keys and of `[models.NAME.outputs]`
output names, how a refusal names a model version (`described`) and the reader of one
output's numbers. The contract a task implements (Task, TaskRegistry) is gateway.api.task;
the nouns it works on (Frame, OutputPlan, OutputError) are gateway.domain."""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from gateway.api.bindings import Binding
from gateway.domain import Located, OutputError, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import RequestDefault
from gateway.models.values import COMMON_KEYS, ModelConfigError, as_table, refuse_unknown
from gateway.upstream.signatures import Signature
from gateway.upstream.tensors import Tensor, as_array

_Config = TypeVar("_Config")
_Own = TypeVar("_Own", covariant=True)


class ConfigKeys(Protocol[_Own]):
    """A task's config module (gateway/tasks/<task>/config.py): its reader of [models.NAME]
    and its config of a model no config file lists; REQUEST_DEFAULTS, when it has
    gateway-wide defaults (the task's `request_defaults`)."""

    @property
    def DEFAULT(self) -> _Own: ...  # the module's constant

    def read_config(self, table: Mapping[str, Any], path: Path, where: str) -> _Own: ...


class FolderTask(Generic[_Config]):
    """The members of gateway.api.task.Task every task folder's task has alike, from its
    folder (the package of the subclass's module): `binding`, its binding.py's BINDING;
    `config`, its config.py (read_config and DEFAULT); `name`, the binding's task. A subclass
    sets `plan_outputs` (signature, its own config of the model -> the OutputPlan) and writes
    resolve, map, cost, compare and summary."""

    name: ClassVar[str]
    binding: ClassVar[Binding]
    config: ConfigKeys[_Config]
    map_in_thread: ClassVar[bool] = False
    finds_instances: ClassVar[bool] = False
    request_defaults: ClassVar[Sequence[RequestDefault]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if hasattr(cls, "binding"):
            return  # a task's subclass (a test's): its folder's already
        folder = cls.__module__.rpartition(".")[0]
        cls.binding = importlib.import_module(f"{folder}.binding").BINDING
        cls.config = importlib.import_module(f"{folder}.config")
        cls.request_defaults = tuple(getattr(cls.config, "REQUEST_DEFAULTS", ()))
        cls.name = cls.binding.task

    def read_config(self, table: Mapping[str, Any], path: Path, where: str) -> _Config:
        return self.config.read_config(table, path, where)

    @staticmethod
    def plan_outputs(signature: Signature, own: Any, /) -> OutputPlan:
        """The plan for a model version from its signature and the task's own config of the
        model (a subclass sets it: `plan_outputs = staticmethod(its plans function)`)."""
        raise NotImplementedError

    def output_plan(self, signature: Signature, config: ModelConfig) -> OutputPlan:
        return self.plan_outputs(signature, self.own(config))

    def instances(self, result: Any) -> Sequence[Located] | None:
        """None: a task that finds no instances (a detecting task returns its list)."""
        return None

    def own(self, config: ModelConfig) -> _Config:
        """The task's own config of a model (its defaults for one no config file lists)."""
        return task_config(config, self.config.DEFAULT)


def task_config(config: ModelConfig, default: _Config) -> _Config:
    """A task's own config of a model (`ModelConfig.task_config`, as its read_config made
    it), or `default` for a model no config file lists (task_config None)."""
    own = config.task_config
    return own if isinstance(own, type(default)) else default


def read_own_keys(table: Mapping[str, Any], own: Collection[str], path: Path, where: str) -> None:
    """Refuses by name a key of [models.NAME] (`table` at `where`) that is neither one every
    model has (COMMON_KEYS, read by gateway.models) nor one of the task's `own`."""
    refuse_unknown(table, {*COMMON_KEYS, *own}, str(path), where + ".")


def read_outputs(
    table: Mapping[str, Any], keys: Collection[str], path: Path, where: str
) -> tuple[Mapping[str, Any], str]:
    """[models.NAME.outputs] of the model table `table` at `where`, its keys among `keys`
    (others refused by name), and where it is ("models.NAME.outputs")."""
    where = where + ".outputs"
    outputs = as_table(table.get("outputs", {}), path, where)
    refuse_unknown(outputs, set(keys), str(path), where + ".")
    return outputs, where


def output_names(
    outputs: Mapping[str, Any], keys: Collection[str], path: Path, where: str
) -> dict[str, str]:
    """The `keys` of [models.NAME.outputs] that are given, each the name of an output of the
    signature (a non-empty string, or ModelConfigError naming it)."""
    names: dict[str, str] = {}
    for key in keys:
        if key in outputs:
            value = outputs[key]
            if not isinstance(value, str) or not value:
                raise ModelConfigError(
                    f"{path}: {where}.{key} must name an output of the signature"
                )
            names[key] = value
    return names


def described(signature: Signature) -> tuple[str, str]:
    """How a refusal names a model version ("model 'm' version 3") and shows its signature."""
    return (
        f"model '{signature.model}' version {signature.version}",
        f"its '{signature.name}' signature has {signature.describe()}",
    )


def numbers(outputs: Mapping[str, Tensor], key: str) -> np.ndarray:
    """The output `key` of TF Serving's response as an array of numbers, or OutputError."""
    if key not in outputs:
        raise OutputError(f"TF Serving response lacks output '{key}'")
    values = as_array(outputs[key])
    if values.dtype.kind not in "fiu":
        raise OutputError(f"{key} has dtype {values.dtype}; expected numbers")
    return values
