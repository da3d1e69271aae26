"""The per-model configuration file (`--model-config FILE`, TOML): what a signature does not say.

    default_model = "detector"            # optional: overrides --model

    [defaults]                            # optional: the model a task uses when a request
    detection = "detector"                #   names none (else --model, when it has that task)
    classification = "classifier"

    [models.detector]
    task = "detection"                    # detection | classification
    label_map = "label_map.pbtxt"         # OD API label map (paths relative to this file)
    min_score = 0.5                       # request defaults
    max_detections = 100

    [models.classifier_logits]
    task = "classification"
    labels = "labels.txt"                 # one label per line; line k is class id k
    top_k = 5
    [models.classifier_logits.input]      # preparation the graph does not do
    scale = 0.00392156862745098           # pixel values (0..255) times this ...
    mean = [0.5, 0.5, 0.5]                # ... minus mean, divided by std, per channel
    std = [0.5, 0.5, 0.5]
    layout = "NCHW"                       # NHWC | NCHW (default: read from the signature)

Other `input` keys: `resize = [height, width]` (when the signature does not fix the size),
`max_side` (longest side sent; larger images are scaled down), `dtype` (uint8 | float32, a
check against the signature), `channel_order` (RGB | BGR; mean and std are in the model's
order), `name` (the input to fill when the signature has several), `string_encoding` (raw |
base64url | tf_example, for string inputs) with `tf_example_key` (default image/encoded),
`resize_filter` (pillow-bilinear | pillow-bicubic | tf-bilinear | tf-bilinear-antialias |
nearest: the exporter's resizing, exactly; default: the fast path).
`signature = "..."` in [models.NAME] picks a signature other than serving_default.
`[models.NAME.batching]` (`enabled`, `max_batch`, `max_delay_ms`) says how requests waiting
for the model are coalesced into one Predict (gateway/models/batching.py);
`[models.NAME.limits]` (`max_detections`, `max_mask_pixels`, `max_answer_bytes`) caps one
request's work (gateway/models/limits.py);
`[pipelines.NAME]` runs a model on the crops of the instances another finds
(gateway/models/pipelines.py, docs/pipelines.md);
`[models.NAME.rollout]` (`current`, `canary`, `sticky`, `shadow`) serves a candidate version
to a share of requests or copies them to it (gateway/models/rollout.py); `input.pad_to =
[height, width]` with `input.pad_value` letterboxes variable-size images so they can be.

A task's own keys (its request defaults such as `min_score`, and `[models.NAME.outputs]`,
which says what the signature does not; docs/models.md has one per exporter) are read by the
task (gateway/tasks/<task>/config.py), given here as `tasks`: name -> reader.

Without the file every model is a detection model with the flags' defaults.
Unknown keys and impossible combinations are refused at startup, naming the key.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.labels import Labels, LabelsError
from gateway.models.batching import read_batching
from gateway.models.input_prep import read_input
from gateway.models.limits import read_limits
from gateway.models.pipelines import read_pipelines
from gateway.models.rollout import read_rollout
from gateway.models.registry import DEFAULT_SIGNATURE, ModelConfig, ModelRegistry
from gateway.models.values import (
    ModelConfigError,
    as_table,
    read_file_name,
    refuse_unknown,
)

_TOP_KEYS = {"default_model", "defaults", "models", "pipelines"}
# A task's reader of its own keys: ([models.NAME], file, "models.NAME") -> the task's config.
ConfigReader = Callable[[Mapping[str, Any], Path, str], Any]


def load_registry(
    path: Path,
    default_model: str,
    label_maps: Mapping[str, Labels] | None = None,
    *,
    tasks: Mapping[str, ConfigReader],
) -> ModelRegistry:
    """Reads a model config file whose models may have the `tasks` named (each read by
    its reader; the first is the task of a model the file does not list); raises
    ModelConfigError naming the file and the key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelConfigError(f"cannot read model config {path}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{path}: not valid TOML: {e}") from None
    return parse_registry(data, path, default_model, label_maps, tasks=tasks)


def parse_registry(
    data: Mapping[str, Any],
    path: Path,
    default_model: str,
    label_maps: Mapping[str, Labels] | None = None,
    *,
    tasks: Mapping[str, ConfigReader],
) -> ModelRegistry:
    refuse_unknown(data, _TOP_KEYS, str(path), "")
    default_task = next(iter(tasks), "")
    models_table = as_table(data.get("models", {}), path, "models")
    models: dict[str, ModelConfig] = {}
    for name, table in models_table.items():
        models[name] = _model(name, as_table(table, path, f"models.{name}"), path, tasks)
    # --label-maps still applies to models the file lists without labels, and to others.
    for name, labels in (label_maps or {}).items():
        config = models.get(name)
        if config is None:
            models[name] = ModelConfig(name, default_task, labels)
        elif not config.labels.names:
            models[name] = dataclasses.replace(config, labels=labels)

    default = data.get("default_model", default_model)
    if not isinstance(default, str) or not default:
        raise ModelConfigError(f"{path}: default_model must be a model name")
    defaults = as_table(data.get("defaults", {}), path, "defaults")
    refuse_unknown(defaults, set(tasks), str(path), "defaults.")
    task_defaults: dict[str, str] = {}
    for task in tasks:
        chosen = defaults.get(task)
        if chosen is None:
            # The default model serves as its own task's default.
            own_task = models[default].task if default in models else default_task
            if own_task == task:
                task_defaults[task] = default
            continue
        if not isinstance(chosen, str) or not chosen:
            raise ModelConfigError(f"{path}: defaults.{task} must be a model name")
        if chosen in models and models[chosen].task != task:
            raise ModelConfigError(
                f"{path}: defaults.{task} is '{chosen}', which is configured with "
                f"task = '{models[chosen].task}'"
            )
        task_defaults[task] = chosen
    pipelines = read_pipelines(as_table(data.get("pipelines", {}), path, "pipelines"), path)
    return ModelRegistry(models, default, task_defaults, default_task, pipelines)


def _model(
    name: str, table: Mapping[str, Any], path: Path, tasks: Mapping[str, ConfigReader]
) -> ModelConfig:
    where = f"models.{name}"
    task = table.get("task")
    if not isinstance(task, str) or task not in tasks:
        raise ModelConfigError(
            f"{path}: {where}.task must be one of {', '.join(tasks)}, got {task!r}"
        )
    if "label_map" in table and "labels" in table:
        raise ModelConfigError(f"{path}: {where} has both label_map and labels; keep one")
    # The task reads its own keys and refuses any it does not know (and the common ones
    # that do not apply to it).
    task_config = tasks[task](table, path, where)
    base = path.parent
    labels = Labels()
    try:
        if "label_map" in table:
            labels = Labels.load_label_map(base / read_file_name(table, "label_map", path, where))
        elif "labels" in table:
            labels = Labels.load_lines(base / read_file_name(table, "labels", path, where))
    except LabelsError as e:
        raise ModelConfigError(f"{path}: {where}: {e}") from None
    prep = read_input(
        as_table(table.get("input", {}), path, where + ".input"), path, where + ".input"
    )
    batching = read_batching(
        as_table(table.get("batching", {}), path, where + ".batching"), path, where + ".batching"
    )
    rollout = read_rollout(
        as_table(table.get("rollout", {}), path, where + ".rollout"), path, where + ".rollout"
    )
    limits = read_limits(
        as_table(table.get("limits", {}), path, where + ".limits"), path, where + ".limits"
    )
    signature = DEFAULT_SIGNATURE
    if "signature" in table:
        signature = table["signature"]
        if not isinstance(signature, str) or not signature:
            raise ModelConfigError(f"{path}: {where}.signature must be a signature name")
    return ModelConfig(
        name,
        task,
        labels,
        prep,
        signature,
        batching=batching,
        rollout=rollout,
        limits=limits,
        task_config=task_config,
    )
