"""Detection's model-config keys: `min_score` and `max_detections` (request defaults) in
[models.NAME], whose gateway-wide defaults are REQUEST_DEFAULTS (--min-score,
--max-detections), and in [models.NAME.outputs] which signature output is what where the
names do not say (DetectionOutputs). Tasks built on detection (instance segmentation,
keypoints) read the same keys with `read_detection_config(..., extra_outputs=...)` and take
their own from what it hands back."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.models.limits import RequestDefault
from gateway.models.values import (
    ModelConfigError,
    read_choice,
    read_integer,
    read_number,
)
from gateway.tasks.base import output_names, read_outputs, read_own_keys

# YOLO heads: Ultralytics' own NMS IoU default; candidates kept for NMS after the score filter
# (a trained model leaves far fewer above its min_score; this bounds the work per image).
DEFAULT_NMS_IOU = 0.45
DEFAULT_MAX_CANDIDATES = 1000
BOX_FORMATS = ("yxyx", "xyxy", "xywh", "cxcywh")
BOX_COORDINATES = ("normalized", "pixels", "image_info")
DECODERS = ("yolo",)
_NAMES = ("boxes", "scores", "classes", "num_detections", "image_info")
OUTPUT_KEYS = frozenset(
    {*_NAMES, "box_format", "box_coordinates", "class_offset", "decoder", "nms_iou",
     "max_candidates"}
)  # fmt: skip


@dataclass(frozen=True)
class DetectionOutputs:
    """`[models.NAME.outputs]` of a detector. `declared` holds the keys the config gave, so
    a plan can tell a choice from a default."""

    boxes: str | None = None
    scores: str | None = None
    classes: str | None = None
    num_detections: str | None = None
    box_format: str = "yxyx"
    box_coordinates: str = "normalized"
    image_info: str | None = None
    class_offset: int = 0
    decoder: str | None = None  # a raw head's decoder ("yolo")
    nms_iou: float = DEFAULT_NMS_IOU
    max_candidates: int = DEFAULT_MAX_CANDIDATES
    declared: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DetectionConfig:
    """A detector's own model config; None: the gateway-wide default (--min-score,
    --max-detections)."""

    min_score: float | None = None
    max_detections: int | None = None
    outputs: DetectionOutputs = field(default_factory=DetectionOutputs)


DEFAULT = DetectionConfig()
# The gateway-wide defaults of the two keys (gateway.flags makes each a flag), for every task
# built on detection: keypoints and instance segmentation take them too.
MIN_SCORE = RequestDefault("min_score", 0.5, "default minimum score", 0.0, 1.0)
MAX_DETECTIONS = RequestDefault("max_detections", 100, "default maximum detections per image", 1)
REQUEST_DEFAULTS = (MIN_SCORE, MAX_DETECTIONS)


def read_detection_config(
    table: Mapping[str, Any],
    path: Path,
    where: str,
    *,
    extra_keys: Collection[str] = (),
    extra_outputs: Collection[str] = (),
    decoders: Collection[str] = DECODERS,
) -> tuple[DetectionConfig, dict[str, Any], dict[str, Any]]:
    """[models.NAME] (`table`, at `where`) of a model built on detection: its config, and the
    `extra_keys` of the model table and the `extra_outputs` of its [outputs] found there (for
    the caller's own reading); any other key is refused by name. `decoders` are the raw-head
    decoders the caller accepts."""
    read_own_keys(table, ("min_score", "max_detections", *extra_keys), path, where)
    outputs_table, outputs_where = read_outputs(table, {*OUTPUT_KEYS, *extra_outputs}, path, where)
    config = DetectionConfig(
        min_score=read_number(table, "min_score", path, where, 0.0, 1.0),
        max_detections=read_integer(table, "max_detections", path, where),
        outputs=_read_outputs(outputs_table, path, outputs_where, decoders),
    )
    extra = {key: table[key] for key in extra_keys if key in table}
    extra_out = {key: outputs_table[key] for key in extra_outputs if key in outputs_table}
    return config, extra, extra_out


@dataclass(frozen=True)
class OnDetection:
    """The config of a task built on detection (keypoints, instance segmentation): detection's
    config, and the task's own keys beside it (a subclass's fields)."""

    detection: DetectionConfig = field(default_factory=DetectionConfig)

    @property
    def decoder(self) -> str | None:
        return self.detection.outputs.decoder


def read_on_detection(
    table: Mapping[str, Any],
    path: Path,
    where: str,
    output_keys: Collection[str],
    output_names_of: Collection[str],
    decoders: Collection[str],
) -> tuple[DetectionConfig, dict[str, Any], dict[str, str], str]:
    """[models.NAME] of a task built on detection: detection's config (with the raw-head
    `decoders` the task accepts), the task's `output_keys` of [outputs] found there, those of
    `output_names_of` among them (each checked to name an output), and where [outputs] is."""
    detection, _, extra = read_detection_config(
        table, path, where, extra_outputs=output_keys, decoders=decoders
    )
    where = where + ".outputs"
    return detection, extra, output_names(extra, output_names_of, path, where), where


def read_config(table: Mapping[str, Any], path: Path, where: str) -> DetectionConfig:
    config, _, _ = read_detection_config(table, path, where)
    return config


def _read_outputs(
    table: Mapping[str, Any], path: Path, where: str, decoders: Collection[str]
) -> DetectionOutputs:
    names = output_names(table, _NAMES, path, where)
    box_format = read_choice(table, "box_format", BOX_FORMATS, path, where) or "yxyx"
    coordinates = (
        read_choice(table, "box_coordinates", BOX_COORDINATES, path, where) or "normalized"
    )
    if "image_info" in table and coordinates != "image_info":
        raise ModelConfigError(f"{path}: {where}.image_info is for box_coordinates = 'image_info'")
    class_offset = 0
    if "class_offset" in table:
        class_offset = table["class_offset"]
        if not isinstance(class_offset, int) or isinstance(class_offset, bool):
            raise ModelConfigError(f"{path}: {where}.class_offset must be a whole number")
    decoder = read_choice(table, "decoder", tuple(decoders), path, where)
    nms_iou = read_number(table, "nms_iou", path, where, 0.0, 1.0)
    max_candidates = read_integer(table, "max_candidates", path, where)
    if decoder is None and ("nms_iou" in table or "max_candidates" in table):
        raise ModelConfigError(
            f"{path}: {where}.nms_iou and .max_candidates are for decoder = "
            f"{' | '.join(repr(d) for d in decoders)} (models that give raw candidates); "
            "other detection models do NMS in their graph"
        )
    if decoder is not None:
        clash = sorted(set(table) & {*_NAMES, "box_format", "box_coordinates"})
        if clash:
            raise ModelConfigError(
                f"{path}: {where}.decoder = '{decoder}' reads the head's outputs itself; "
                f"remove {', '.join(clash)}"
            )
    return DetectionOutputs(
        **names,
        box_format=box_format,
        box_coordinates=coordinates,
        class_offset=class_offset,
        decoder=decoder,
        nms_iou=DEFAULT_NMS_IOU if nms_iou is None else nms_iou,
        max_candidates=max_candidates or DEFAULT_MAX_CANDIDATES,
        declared=frozenset(table),
    )
