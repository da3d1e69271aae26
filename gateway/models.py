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
check against the signature), `string_encoding` (raw | base64url, for string inputs).

Without the file every model is a detection model with the flags' defaults, as before.
Unknown keys and impossible combinations are refused at startup, naming the key.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.labels import Labels, LabelsError

# The built-in tasks' names, for their own config rules below; which tasks exist is the
# app's task registry's business (its names are passed in as `tasks`).
DETECTION = "detection"
CLASSIFICATION = "classification"
# Classification's top_k when neither the request nor the model config gives one.
DEFAULT_TOP_K = 5


class ModelConfigError(ValueError):
    """A model config file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class InputPrep:
    """How the gateway prepares an image for the model, where the graph does not do it."""

    resize: tuple[int, int] | None = None  # (height, width) for signatures without a size
    max_side: int | None = None
    scale: float | None = None  # None: pixel values as they are (0..255)
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    layout: str | None = None  # NHWC | NCHW; None: from the signature
    dtype: str | None = None  # uint8 | float32; None: from the signature
    string_encoding: str = "raw"  # raw | base64url


@dataclass(frozen=True)
class ModelConfig:
    name: str
    task: str = DETECTION
    labels: Labels = field(default_factory=Labels)
    input: InputPrep = field(default_factory=InputPrep)
    # Request defaults; None means the gateway-wide default.
    min_score: float | None = None
    max_detections: int | None = None
    top_k: int | None = None


_MAX_UNLISTED = 1024


@dataclass(frozen=True)
class ModelRegistry:
    """Every configured model, the default model, and the default model of each task."""

    models: Mapping[str, ModelConfig]
    default_model: str
    task_defaults: Mapping[str, str]
    # Configs made for unlisted models, kept (bounded: callers choose the names) so that a
    # request for one does not build its config again.
    _unlisted: dict[tuple[str, str], ModelConfig] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def get(self, name: str, task: str) -> ModelConfig:
        """The config of `name` for `task`; an unlisted model gets the task's defaults."""
        config = self.models.get(name)
        if config is None:
            config = self._unlisted.get((name, task))
            if config is None:
                if len(self._unlisted) >= _MAX_UNLISTED:
                    self._unlisted.clear()
                config = self._unlisted[(name, task)] = ModelConfig(name=name, task=task)
        return config

    def task_of(self, name: str) -> str:
        """The task of model `name`: its config's; detection for a model the config does not
        list (as without a config file)."""
        config = self.models.get(name)
        return config.task if config is not None else DETECTION

    def default_for(self, task: str) -> str | None:
        return self.task_defaults.get(task)


_TOP_KEYS = {"default_model", "defaults", "models"}
_MODEL_KEYS = {
    "task",
    "label_map",
    "labels",
    "input",
    "min_score",
    "max_detections",
    "top_k",
}
_INPUT_KEYS = {
    "resize",
    "max_side",
    "scale",
    "mean",
    "std",
    "layout",
    "dtype",
    "string_encoding",
}


def default_registry(
    default_model: str, label_maps: Mapping[str, Labels] | None = None
) -> ModelRegistry:
    """Today's behaviour without a file: every model is a detection model."""
    models = {
        name: ModelConfig(name=name, task=DETECTION, labels=labels)
        for name, labels in (label_maps or {}).items()
    }
    return ModelRegistry(models, default_model, {DETECTION: default_model})


def load_registry(
    path: Path,
    default_model: str,
    label_maps: Mapping[str, Labels] | None = None,
    *,
    tasks: Collection[str],
) -> ModelRegistry:
    """Reads a model config file whose models may have the `tasks` named; raises
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
    tasks: Collection[str],
) -> ModelRegistry:
    _unknown(data, _TOP_KEYS, str(path), "")
    models_table = _table(data.get("models", {}), path, "models")
    models: dict[str, ModelConfig] = {}
    for name, table in models_table.items():
        models[name] = _model(name, _table(table, path, f"models.{name}"), path, tasks)
    # --label-maps still applies to models the file lists without labels, and to others.
    for name, labels in (label_maps or {}).items():
        config = models.get(name)
        if config is None:
            models[name] = ModelConfig(name, DETECTION, labels)
        elif not config.labels.names:
            models[name] = dataclasses.replace(config, labels=labels)

    default = data.get("default_model", default_model)
    if not isinstance(default, str) or not default:
        raise ModelConfigError(f"{path}: default_model must be a model name")
    defaults = _table(data.get("defaults", {}), path, "defaults")
    _unknown(defaults, set(tasks), str(path), "defaults.")
    task_defaults: dict[str, str] = {}
    for task in tasks:
        chosen = defaults.get(task)
        if chosen is None:
            # The default model serves as its own task's default.
            own_task = models[default].task if default in models else DETECTION
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
    return ModelRegistry(models, default, task_defaults)


def _model(name: str, table: Mapping[str, Any], path: Path, tasks: Collection[str]) -> ModelConfig:
    where = f"models.{name}"
    _unknown(table, _MODEL_KEYS, str(path), where + ".")
    task = table.get("task")
    if not isinstance(task, str) or task not in tasks:
        raise ModelConfigError(
            f"{path}: {where}.task must be one of {', '.join(tasks)}, got {task!r}"
        )
    if "label_map" in table and "labels" in table:
        raise ModelConfigError(f"{path}: {where} has both label_map and labels; keep one")
    if task == CLASSIFICATION and "label_map" in table:
        raise ModelConfigError(
            f"{path}: {where}.label_map is an OD API (detection) label map; classification "
            "models take labels = 'labels.txt' (one label per line, line k is class id k)"
        )
    for key, wrong_task in (("max_detections", CLASSIFICATION), ("top_k", DETECTION)):
        if key in table and task == wrong_task:
            raise ModelConfigError(f"{path}: {where}.{key} does not apply to task '{task}'")
    base = path.parent
    labels = Labels()
    try:
        if "label_map" in table:
            labels = Labels.load_label_map(base / _string(table, "label_map", path, where))
        elif "labels" in table:
            labels = Labels.load_lines(base / _string(table, "labels", path, where))
    except LabelsError as e:
        raise ModelConfigError(f"{path}: {where}: {e}") from None
    min_score = _number(table, "min_score", path, where, 0.0, 1.0)
    max_detections = _integer(table, "max_detections", path, where)
    top_k = _integer(table, "top_k", path, where)
    prep = _input(_table(table.get("input", {}), path, where + ".input"), path, where + ".input")
    return ModelConfig(name, task, labels, prep, min_score, max_detections, top_k)


def _input(table: Mapping[str, Any], path: Path, where: str) -> InputPrep:
    _unknown(table, _INPUT_KEYS, str(path), where + ".")
    resize = None
    if "resize" in table:
        value = table["resize"]
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int) and v > 0 for v in value)
        ):
            raise ModelConfigError(f"{path}: {where}.resize must be [height, width] in pixels")
        resize = (value[0], value[1])
    max_side = _integer(table, "max_side", path, where)
    if resize is not None and max_side is not None:
        raise ModelConfigError(
            f"{path}: {where} has both resize and max_side; a fixed size already bounds the side"
        )
    scale = _number(table, "scale", path, where, 0.0, None)
    mean = _triple(table, "mean", path, where)
    std = _triple(table, "std", path, where)
    if std is not None and any(v == 0 for v in std):
        raise ModelConfigError(f"{path}: {where}.std must not contain 0")
    layout = _choice(table, "layout", ("NHWC", "NCHW"), path, where)
    dtype = _choice(table, "dtype", ("uint8", "float32"), path, where)
    encoding = _choice(table, "string_encoding", ("raw", "base64url"), path, where) or "raw"
    normalises = scale is not None or mean is not None or std is not None
    if dtype == "uint8" and normalises:
        raise ModelConfigError(
            f"{path}: {where}: scale, mean and std need dtype = 'float32' (uint8 inputs take "
            "the pixels as they are)"
        )
    if encoding != "raw" and (normalises or layout is not None or dtype is not None):
        raise ModelConfigError(
            f"{path}: {where}.string_encoding is for models that take encoded images; "
            "scale, mean, std, layout and dtype are for models that take pixels"
        )
    return InputPrep(resize, max_side, scale, mean, std, layout, dtype, encoding)


def _unknown(table: Mapping[str, Any], known: set[str], path: str, prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ModelConfigError(
                f"{path}: unknown key '{prefix}{key}' (known here: {', '.join(sorted(known))})"
            )


def _table(value: Any, path: Path, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ModelConfigError(f"{path}: {where} must be a table")
    return value


def _string(table: Mapping[str, Any], key: str, path: Path, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ModelConfigError(f"{path}: {where}.{key} must be a file name")
    return value


def _number(
    table: Mapping[str, Any],
    key: str,
    path: Path,
    where: str,
    low: float,
    high: float | None,
) -> float | None:
    if key not in table:
        return None
    value = table[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and (value <= low if high is None else not low <= value <= high):
        ok = False
    if not ok:
        bound = f"above {low}" if high is None else f"in [{low}, {high}]"
        raise ModelConfigError(f"{path}: {where}.{key} must be a number {bound}, got {value!r}")
    return float(value)


def _integer(table: Mapping[str, Any], key: str, path: Path, where: str) -> int | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelConfigError(f"{path}: {where}.{key} must be a whole number >= 1, got {value!r}")
    return value


def _triple(
    table: Mapping[str, Any], key: str, path: Path, where: str
) -> tuple[float, float, float] | None:
    if key not in table:
        return None
    value = table[key]
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise ModelConfigError(f"{path}: {where}.{key} must be three numbers (R, G, B)")
    return (float(value[0]), float(value[1]), float(value[2]))


def _choice(
    table: Mapping[str, Any], key: str, allowed: tuple[str, ...], path: Path, where: str
) -> str | None:
    if key not in table:
        return None
    value = table[key]
    if value not in allowed:
        raise ModelConfigError(
            f"{path}: {where}.{key} must be one of {', '.join(allowed)}, got {value!r}"
        )
    return str(value)
