"""What the task folders share: a task's own config of a model (`task_config`). The contract a
task implements (Task, TaskRegistry) is gateway.api.task; the nouns it works on (Frame,
OutputPlan, OutputError) are gateway.domain."""

from __future__ import annotations

from typing import TypeVar

from gateway.models import ModelConfig

_Config = TypeVar("_Config")


def task_config(config: ModelConfig, default: _Config) -> _Config:
    """A task's own config of a model (`ModelConfig.task_config`, as its read_config made
    it), or `default` for a model no config file lists (task_config None)."""
    own = config.task_config
    return own if isinstance(own, type(default)) else default
