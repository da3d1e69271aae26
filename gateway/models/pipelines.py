"""`[pipelines.NAME]`: cascades of served models, read from the model config file.

    [pipelines.vehicles]
    detect = "detector"                    # the first model: it finds the instances
    min_score = 0.4                        # the first model's request options (defaults)
    [[pipelines.vehicles.steps]]
    name = "colour"                        # the key under which results attach
    model = "classifier_scores"            # any served model; its task decides the result
    labels = ["car", "truck"]              # parent labels the step runs on (all when absent)
    padding = 0.1                          # crop margin on each side, a share of the box
    min_size = 16                          # boxes smaller on a side are skipped, and say so
    max_crops = 32                         # crops per image; the rest are skipped, and say so
    required = false                       # true: a failed crop fails the whole request
    top_k = 1                              # the step model's task's own request options

Here the keys are read and bounded; whether the models' tasks fit (the first finds instances)
and the options are their tasks' is checked against the task registry when the gateway
starts (gateway.core.cascade), with the same messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError, as_table, is_number, is_whole

# Crops one step may cut from one image, at most (an operator's ceiling: each crop is a
# decode, a resize and a model call's share).
MAX_CROPS_LIMIT = 256
DEFAULT_MAX_CROPS = 32
# Steps one pipeline may have: each attaches one result per instance.
MAX_STEPS = 16
# Step names: keys of the result's map, shown in JSON and metrics.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")

_PIPELINE_KEYS = {"detect", "steps"}
_STEP_KEYS = {"name", "model", "labels", "padding", "min_size", "max_crops", "required"}


@dataclass(frozen=True)
class StepConfig:
    """One step: a model run on the crop of each instance the first model found."""

    name: str
    model: str
    labels: frozenset[str] | None = None  # None: every instance
    padding: float = 0.0
    min_size: int = 1
    max_crops: int = DEFAULT_MAX_CROPS
    required: bool = False
    # The step model's request options (its task's, e.g. top_k), checked at startup.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    detect: str  # the first model
    options: Mapping[str, Any]  # its request options (its task's), checked at startup
    steps: tuple[StepConfig, ...]


def read_pipelines(table: Mapping[str, Any], path: Path) -> dict[str, PipelineConfig]:
    """Every `[pipelines.NAME]` of the file at `path`; ModelConfigError naming the key."""
    pipelines: dict[str, PipelineConfig] = {}
    for name, value in table.items():
        where = f"pipelines.{name}"
        if not _NAME.fullmatch(name):
            raise ModelConfigError(
                f"{path}: {where}: a pipeline's name is lower-case letters, digits and _, "
                "starting with a letter (it is part of the HTTP route)"
            )
        pipelines[name] = _pipeline(name, as_table(value, path, where), path, where)
    return pipelines


def _pipeline(name: str, table: Mapping[str, Any], path: Path, where: str) -> PipelineConfig:
    detect = table.get("detect")
    if not isinstance(detect, str) or not detect:
        raise ModelConfigError(f"{path}: {where}.detect must name the first model")
    steps_value = table.get("steps")
    if not isinstance(steps_value, list) or not steps_value:
        raise ModelConfigError(
            f"{path}: {where} needs at least one [[{where}.steps]] (a model run on each crop)"
        )
    if len(steps_value) > MAX_STEPS:
        raise ModelConfigError(f"{path}: {where} has {len(steps_value)} steps; at most {MAX_STEPS}")
    steps: list[StepConfig] = []
    for index, step in enumerate(steps_value):
        steps.append(_step(as_table(step, path, f"{where}.steps[{index}]"), path, where, index))
    names = [step.name for step in steps]
    for step_name in names:
        if names.count(step_name) > 1:
            raise ModelConfigError(f"{path}: {where} has two steps named '{step_name}'")
    options = {key: value for key, value in table.items() if key not in _PIPELINE_KEYS}
    return PipelineConfig(name, detect, options, tuple(steps))


def _step(table: Mapping[str, Any], path: Path, pipeline: str, index: int) -> StepConfig:
    where = f"{pipeline}.steps[{index}]"
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ModelConfigError(
            f"{path}: {where}.name must be lower-case letters, digits and _, starting with a "
            f"letter (the key results attach under), got {name!r}"
        )
    where = f"{pipeline}.steps '{name}'"
    model = table.get("model")
    if not isinstance(model, str) or not model:
        raise ModelConfigError(f"{path}: {where}: model must name a served model")
    labels = None
    if "labels" in table:
        value = table["labels"]
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(label, str) and label for label in value)
        ):
            raise ModelConfigError(
                f"{path}: {where}: labels must be a list of the first model's label names"
            )
        labels = frozenset(value)
    padding = table.get("padding", 0.0)
    if not is_number(padding) or not 0 <= padding <= 1:
        raise ModelConfigError(
            f"{path}: {where}: padding must be a share of the box in [0, 1], got {padding!r}"
        )
    min_size = table.get("min_size", 1)
    if not is_whole(min_size) or min_size < 1:
        raise ModelConfigError(
            f"{path}: {where}: min_size must be a whole number of pixels >= 1, got {min_size!r}"
        )
    max_crops = table.get("max_crops", DEFAULT_MAX_CROPS)
    if not is_whole(max_crops) or not 1 <= max_crops <= MAX_CROPS_LIMIT:
        raise ModelConfigError(
            f"{path}: {where}: max_crops must be a whole number from 1 to {MAX_CROPS_LIMIT}, "
            f"got {max_crops!r}"
        )
    required = table.get("required", False)
    if not isinstance(required, bool):
        raise ModelConfigError(f"{path}: {where}: required must be true or false")
    options = {key: value for key, value in table.items() if key not in _STEP_KEYS}
    return StepConfig(name, model, labels, float(padding), min_size, max_crops, required, options)
