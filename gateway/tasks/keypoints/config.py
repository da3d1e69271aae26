"""The keypoints task's model-config keys: detection's (`min_score`, `max_detections`, and in
[models.NAME.outputs] the box, score and class outputs: gateway.tasks.detection.config) plus,
in [models.NAME.outputs]:
- `decoder = "yolo-pose"` for a YOLOv8/11-pose raw head `[batch, 4 + classes + 3K,
  candidates]`, with `predictions` naming that output when the signature has several
  (`nms_iou`, `max_candidates` as for detection's `yolo`);
- or `keypoints` + `keypoint_scores` naming OD API-style outputs `[batch, N, K, 2]`
  (normalized y, x) and `[batch, N, K]` (default `detection_keypoints`,
  `detection_keypoint_scores`);
- `keypoint_names`: "coco17" (the default for 17 points) or a list of K names;
- `skeleton`: pairs of keypoint names or 0-based indices (default: COCO's for coco17, none
  otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError
from gateway.tasks.detection.config import REQUEST_DEFAULTS as DETECTION_DEFAULTS
from gateway.tasks.detection.config import OnDetection, read_on_detection
from gateway.tasks.keypoints.names import COCO17, COCO17_NAMES, COCO17_SKELETON

YOLO_POSE = "yolo-pose"
DECODERS = (YOLO_POSE,)
_OUTPUT_NAMES = ("predictions", "keypoints", "keypoint_scores")
OUTPUT_KEYS = (*_OUTPUT_NAMES, "keypoint_names", "skeleton")
MAX_KEYPOINTS = 1024  # far above any model's; bounds a config's lists


@dataclass(frozen=True)
class KeypointConfig(OnDetection):
    """A keypoint model's own config. `names` is None when the config gives none: COCO-17's
    for a model with 17 points, refused for others; `skeleton` None: COCO's for COCO-17's
    names, none otherwise."""

    predictions: str | None = None
    keypoints: str | None = None
    keypoint_scores: str | None = None
    names: tuple[str, ...] | None = None
    skeleton: tuple[tuple[int, int], ...] | None = None


DEFAULT = KeypointConfig()
REQUEST_DEFAULTS = DETECTION_DEFAULTS  # detection's: --min-score, --max-detections


def read_config(table: Mapping[str, Any], path: Path, where: str) -> KeypointConfig:
    detection, extra, outputs, where = read_on_detection(
        table, path, where, OUTPUT_KEYS, _OUTPUT_NAMES, DECODERS
    )
    decoder = detection.outputs.decoder
    if decoder is None and "predictions" in outputs:
        raise ModelConfigError(
            f"{path}: {where}.predictions names the raw head of decoder = '{YOLO_POSE}'; "
            "set that decoder, or remove predictions"
        )
    clash = sorted({"keypoints", "keypoint_scores"} & set(outputs))
    if decoder is not None and clash:
        raise ModelConfigError(
            f"{path}: {where}.decoder = '{decoder}' reads the keypoints from the head itself; "
            f"remove {', '.join(clash)}"
        )
    names = _read_names(extra.get("keypoint_names"), path, where)
    skeleton = None
    if "skeleton" in extra:
        skeleton = _read_skeleton(extra["skeleton"], names or COCO17_NAMES, path, where)
    return KeypointConfig(detection, names=names, skeleton=skeleton, **outputs)


def names_and_skeleton(
    names: tuple[str, ...] | None, skeleton: tuple[tuple[int, int], ...] | None, count: int
) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]] | None:
    """The names and skeleton of a model with `count` keypoints from the config's (None: not
    given); None when the config gives no names and `count` is not COCO-17's."""
    if names is None:
        if count != len(COCO17_NAMES):
            return None
        names = COCO17_NAMES
    if skeleton is None:
        skeleton = COCO17_SKELETON if names == COCO17_NAMES else ()
    return names, skeleton


def _read_names(value: Any, path: Path, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if value == COCO17:
        return COCO17_NAMES
    wanted = (
        f'{path}: {where}.keypoint_names must be "{COCO17}" or a list of distinct names, '
        f"one per keypoint in the model's order"
    )
    if (
        not isinstance(value, list)
        or not value
        or len(value) > MAX_KEYPOINTS
        or not all(isinstance(name, str) and name for name in value)
    ):
        raise ModelConfigError(f"{wanted}, got {value!r}"[:400])
    repeated = sorted({name for name in value if value.count(name) > 1})
    if repeated:
        raise ModelConfigError(f"{wanted}; {', '.join(map(repr, repeated))} repeats")
    return tuple(value)


def _read_skeleton(
    value: Any, names: tuple[str, ...], path: Path, where: str
) -> tuple[tuple[int, int], ...]:
    wanted = (
        f"{path}: {where}.skeleton must be a list of pairs of keypoint names or 0-based "
        f'indices (e.g. [["left_shoulder", "left_elbow"], [5, 6]])'
    )
    if not isinstance(value, list) or len(value) > MAX_KEYPOINTS * MAX_KEYPOINTS:
        raise ModelConfigError(f"{wanted}, got {value!r}"[:400])
    index = {name: i for i, name in enumerate(names)}
    edges: list[tuple[int, int]] = []
    for edge in value:
        if not isinstance(edge, list) or len(edge) != 2:
            raise ModelConfigError(f"{wanted}; {edge!r} is not a pair"[:400])
        ends: list[int] = []
        for end in edge:
            if isinstance(end, str):
                if end not in index:
                    raise ModelConfigError(
                        f"{wanted}; {end!r} is not one of the keypoint names ({', '.join(names)})"[
                            :600
                        ]
                    )
                ends.append(index[end])
            elif isinstance(end, int) and not isinstance(end, bool) and 0 <= end < len(names):
                ends.append(end)
            else:
                raise ModelConfigError(
                    f"{wanted}; {end!r} is neither a keypoint name nor an index from 0 to "
                    f"{len(names) - 1}"
                )
        if ends[0] == ends[1]:
            raise ModelConfigError(f"{wanted}; {edge!r} joins a keypoint to itself")
        edges.append((ends[0], ends[1]))
    return tuple(edges)
