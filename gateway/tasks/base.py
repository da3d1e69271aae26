"""What the task folders share: a task's own config of a model (`task_config`), a model's
ceilings on one request's work (`limits_of`). The contract a
task implements (Task, TaskRegistry) is gateway.api.task; the nouns it works on (Frame,
OutputPlan, OutputError) are gateway.domain."""

from __future__ import annotations

from typing import TypeVar

from gateway.config import Settings
from gateway.models import ModelConfig
from gateway.models.limits import Limits
from gateway.models.limits import resolve as resolve_limits

_Config = TypeVar("_Config")


def task_config(config: ModelConfig, default: _Config) -> _Config:
    """A task's own config of a model (`ModelConfig.task_config`, as its read_config made
    it), or `default` for a model no config file lists (task_config None)."""
    own = config.task_config
    return own if isinstance(own, type(default)) else default


def limits_of(config: ModelConfig, settings: Settings) -> Limits:
    """The ceilings on one request's work for a model: its [models.NAME.limits], else the
    gateway's (--max-detections-limit, --max-mask-pixels, --max-answer-bytes)."""
    return resolve_limits(
        config.limits, config.name, settings.max_detections_limit, settings.max_mask_pixels,
        settings.max_answer_bytes,
    )  # fmt: skip
