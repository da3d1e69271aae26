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
base64url | tf_example, for string inputs) with `tf_example_key` (default image/encoded).
`signature = "..."` in [models.NAME] picks a signature other than serving_default.

`[models.NAME.outputs]` says what the signature does not (docs/models.md has one per exporter):
classification `probabilities`, or `logits` (+ `logits_activation` softmax | sigmoid), or
`label` + `confidence`; detection `boxes`, `scores`, `classes`, `num_detections`,
`box_format` (yxyx | xyxy | xywh | cxcywh), `box_coordinates` (normalized | pixels |
image_info), `image_info`, `class_offset`; raw heads `decoder = "yolo"` with `nms_iou` and
`max_candidates`.

Without the file every model is a detection model with the flags' defaults.
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

DEFAULT_SIGNATURE = "serving_default"

# The built-in tasks' names, for their own config rules below; which tasks exist is the
# app's task registry's business (its names are passed in as `tasks`).
DETECTION = "detection"
CLASSIFICATION = "classification"
# Classification's top_k when neither the request nor the model config gives one.
DEFAULT_TOP_K = 5
DEFAULT_TF_EXAMPLE_KEY = "image/encoded"  # what OD API and Model Garden tf_example exports read
# YOLO heads: Ultralytics' own NMS IoU default; candidates kept for NMS after the score filter
# (a trained model leaves far fewer above its min_score; this bounds the work per image).
DEFAULT_NMS_IOU = 0.45
DEFAULT_MAX_CANDIDATES = 1000
BOX_FORMATS = ("yxyx", "xyxy", "xywh", "cxcywh")
BOX_COORDINATES = ("normalized", "pixels", "image_info")
DECODERS = ("yolo",)


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
    string_encoding: str = "raw"  # raw | base64url | tf_example
    channel_order: str = "RGB"  # RGB | BGR: the order the model takes its channels in
    name: str | None = None  # the signature input to fill; None: its only input
    tf_example_key: str = DEFAULT_TF_EXAMPLE_KEY  # the Example feature holding the image


@dataclass(frozen=True)
class OutputMapping:
    """`[models.NAME.outputs]`: which signature output is what, where the names do not say.

    `declared` holds the keys the config gave, so a plan can tell a choice from a default.
    """

    # classification
    probabilities: str | None = None
    logits: str | None = None
    logits_activation: str = "softmax"  # softmax | sigmoid (multi-label)
    label: str | None = None
    confidence: str | None = None
    # detection
    boxes: str | None = None
    scores: str | None = None
    classes: str | None = None
    num_detections: str | None = None
    box_format: str = "yxyx"
    box_coordinates: str = "normalized"
    image_info: str | None = None
    class_offset: int = 0
    # raw heads
    decoder: str | None = None  # yolo
    nms_iou: float = DEFAULT_NMS_IOU
    max_candidates: int = DEFAULT_MAX_CANDIDATES
    declared: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ModelConfig:
    name: str
    task: str = DETECTION
    labels: Labels = field(default_factory=Labels)
    input: InputPrep = field(default_factory=InputPrep)
    outputs: OutputMapping = field(default_factory=OutputMapping)
    signature: str = DEFAULT_SIGNATURE  # the signature to call (model_spec.signature_name)
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

    def signature_names(self) -> dict[str, str]:
        """Models called with a signature other than serving_default, and its name."""
        return {
            name: config.signature
            for name, config in self.models.items()
            if config.signature != DEFAULT_SIGNATURE
        }


_TOP_KEYS = {"default_model", "defaults", "models"}
_MODEL_KEYS = {
    "task",
    "label_map",
    "labels",
    "input",
    "outputs",
    "signature",
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
    "channel_order",
    "name",
    "tf_example_key",
}
_CLASSIFICATION_OUTPUTS = {"probabilities", "logits", "logits_activation", "label", "confidence"}
_DETECTION_OUTPUTS = {
    "boxes",
    "scores",
    "classes",
    "num_detections",
    "box_format",
    "box_coordinates",
    "image_info",
    "class_offset",
    "decoder",
    "nms_iou",
    "max_candidates",
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
    outputs = _outputs(
        _table(table.get("outputs", {}), path, where + ".outputs"), task, path, where + ".outputs"
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
        outputs,
        signature,
        min_score=min_score,
        max_detections=max_detections,
        top_k=top_k,
    )


def _outputs(table: Mapping[str, Any], task: str, path: Path, where: str) -> OutputMapping:
    # The built-in tasks read their own keys; another task reads what it needs of either set.
    if task == CLASSIFICATION:
        own, other = _CLASSIFICATION_OUTPUTS, _DETECTION_OUTPUTS
    elif task == DETECTION:
        own, other = _DETECTION_OUTPUTS, _CLASSIFICATION_OUTPUTS
    else:
        own, other = _CLASSIFICATION_OUTPUTS | _DETECTION_OUTPUTS, set()
    for key in table:
        if key in other:
            raise ModelConfigError(f"{path}: {where}.{key} does not apply to task '{task}'")
    _unknown(table, own, str(path), where + ".")
    names: dict[str, Any] = {}
    for key in own - {"logits_activation", "box_format", "box_coordinates", "class_offset",
                      "decoder", "nms_iou", "max_candidates"}:  # fmt: skip
        if key in table:
            value = table[key]
            if not isinstance(value, str) or not value:
                raise ModelConfigError(
                    f"{path}: {where}.{key} must name an output of the signature"
                )
            names[key] = value
    declared = frozenset(table)
    if task == CLASSIFICATION:
        forms = [k for k in ("probabilities", "logits", "label") if k in table]
        if len(forms) > 1:
            raise ModelConfigError(
                f"{path}: {where} sets {' and '.join(forms)}; a classifier's scores are one of "
                "probabilities, logits, or label + confidence"
            )
        if ("label" in table) != ("confidence" in table):
            raise ModelConfigError(f"{path}: {where}.label and .confidence go together")
        activation = _choice(table, "logits_activation", ("softmax", "sigmoid"), path, where)
        if activation is not None and "logits" not in table:
            raise ModelConfigError(f"{path}: {where}.logits_activation needs logits = '<output>'")
        return OutputMapping(**names, logits_activation=activation or "softmax", declared=declared)
    box_format = _choice(table, "box_format", BOX_FORMATS, path, where) or "yxyx"
    coordinates = _choice(table, "box_coordinates", BOX_COORDINATES, path, where) or "normalized"
    if "image_info" in table and coordinates != "image_info":
        raise ModelConfigError(f"{path}: {where}.image_info is for box_coordinates = 'image_info'")
    class_offset = 0
    if "class_offset" in table:
        class_offset = table["class_offset"]
        if not isinstance(class_offset, int) or isinstance(class_offset, bool):
            raise ModelConfigError(f"{path}: {where}.class_offset must be a whole number")
    decoder = _choice(table, "decoder", DECODERS, path, where)
    nms_iou = _number(table, "nms_iou", path, where, 0.0, 1.0)
    max_candidates = _integer(table, "max_candidates", path, where)
    if decoder is None and ("nms_iou" in table or "max_candidates" in table):
        raise ModelConfigError(
            f"{path}: {where}.nms_iou and .max_candidates are for decoder = 'yolo' (models "
            "that give raw candidates); other detection models do NMS in their graph"
        )
    if decoder is not None:
        clash = sorted(
            set(table) & {"boxes", "scores", "classes", "num_detections", "box_format",
                          "box_coordinates", "image_info"}
        )  # fmt: skip
        if clash:
            raise ModelConfigError(
                f"{path}: {where}.decoder = '{decoder}' reads the head's one output itself; "
                f"remove {', '.join(clash)}"
            )
    return OutputMapping(
        **names,
        box_format=box_format,
        box_coordinates=coordinates,
        class_offset=class_offset,
        decoder=decoder,
        nms_iou=DEFAULT_NMS_IOU if nms_iou is None else nms_iou,
        max_candidates=max_candidates or DEFAULT_MAX_CANDIDATES,
        declared=declared,
    )


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
    encoding = (
        _choice(table, "string_encoding", ("raw", "base64url", "tf_example"), path, where) or "raw"
    )
    channel_order = _choice(table, "channel_order", ("RGB", "BGR"), path, where) or "RGB"
    name = None
    if "name" in table:
        name = table["name"]
        if not isinstance(name, str) or not name:
            raise ModelConfigError(f"{path}: {where}.name must name an input of the signature")
    example_key = DEFAULT_TF_EXAMPLE_KEY
    if "tf_example_key" in table:
        example_key = table["tf_example_key"]
        if encoding != "tf_example":
            raise ModelConfigError(
                f"{path}: {where}.tf_example_key is for string_encoding = 'tf_example'"
            )
        if not isinstance(example_key, str) or not example_key:
            raise ModelConfigError(f"{path}: {where}.tf_example_key must be a feature name")
    normalises = scale is not None or mean is not None or std is not None
    if dtype == "uint8" and normalises:
        raise ModelConfigError(
            f"{path}: {where}: scale, mean and std need dtype = 'float32' (uint8 inputs take "
            "the pixels as they are)"
        )
    pixel_keys = normalises or layout is not None or dtype is not None or channel_order != "RGB"
    if encoding != "raw" and pixel_keys:
        raise ModelConfigError(
            f"{path}: {where}.string_encoding is for models that take encoded images; "
            "scale, mean, std, layout, dtype and channel_order are for models that take pixels"
        )
    return InputPrep(
        resize,
        max_side,
        scale,
        mean,
        std,
        layout,
        dtype,
        encoding,
        channel_order,
        name,
        example_key,
    )


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
        raise ModelConfigError(
            f"{path}: {where}.{key} must be three numbers, one per channel in the model's "
            "channel_order"
        )
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
