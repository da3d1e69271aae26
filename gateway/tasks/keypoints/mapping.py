"""A keypoint model's outputs for one image -> instances with keypoints in pixels of the
image as a viewer shows it (per request, by the plan's form: gateway.tasks.keypoints.plans).

Boxes, scores and classes go through detection's decoding (gateway.tasks.detection.forms,
which hands back the rows it kept); each kept row's keypoints are then read, checked and
mapped as points: a point is a degenerate box, so Frame.transform (EXIF orientation,
letterboxing) maps it as it maps boxes, and a stretched resize needs nothing, the point being
a fraction of the image already. Points are clamped to the image, as Ultralytics' clip_coords
clamps them (ultralytics/utils/ops.py)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gateway.domain import Frame, OutputError, OutputPlan
from gateway.labels import Labels
from gateway.models import ModelConfig
from gateway.tasks.base import numbers
from gateway.tasks.decoders import pose
from gateway.tasks.detection.forms import map_decoded
from gateway.tasks.detection.nouns import DetectionSettings, Kept
from gateway.tasks.detection.od_api import BOX_MARGIN
from gateway.tasks.keypoints.config import YOLO_POSE, names_and_skeleton
from gateway.tasks.keypoints.nouns import Instance, Keypoint, Keypoints
from gateway.tasks.keypoints.plans import KeypointPlan
from gateway.upstream.tensors import Tensor


def map_keypoints(
    outputs: Mapping[str, Tensor],
    plan: OutputPlan,
    frame: Frame,
    options: DetectionSettings,
    config: ModelConfig,
) -> Keypoints:
    """The task's `map` (gateway.api.task.Task.map)."""
    assert isinstance(plan, KeypointPlan)
    read = _yolo_pose if plan.form == YOLO_POSE else _od
    return read(outputs, plan, frame, config.labels, options)


def _named(plan: KeypointPlan, points: int) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    if plan.points and points != plan.points:
        raise OutputError(f"the outputs give {points} keypoints; the signature says {plan.points}")
    named = names_and_skeleton(plan.names, plan.skeleton, points)
    if named is None or len(named[0]) != points:
        raise OutputError(
            f"the outputs give {points} keypoints; set outputs.keypoint_names to their names "
            "in the model config (COCO-17 names only 17)"
        )
    return named


def _yolo_pose(
    outputs: Mapping[str, Tensor], plan: KeypointPlan, frame: Frame, labels: Labels, kept: Kept
) -> Keypoints:
    assert plan.head is not None and plan.detection is not None
    raw = numbers(outputs, plan.head)
    if raw.ndim != 3 or raw.shape[0] < 1:
        raise OutputError(
            f"{plan.head} has shape {list(raw.shape)}; expected [1, 4 + classes + 3 x "
            "keypoints, candidates]"
        )
    channels = raw.shape[1]
    if plan.names is not None:
        points = len(plan.names)
    else:
        points = (channels - 5) // pose.PER_POINT
        if (channels - 5) % pose.PER_POINT:
            raise OutputError(
                f"{plan.head} has {channels} channels, not 4 box values, one class score and "
                "3 per keypoint; set outputs.keypoint_names in the model config"
            )
    names, skeleton = _named(plan, points)
    try:
        boxes, points_part = pose.split_head(raw[0], points)
    except ValueError as e:
        raise OutputError(f"{plan.head}: {e}") from None
    found, rows, _ = map_decoded({plan.head: boxes[None]}, plan.detection, frame, labels, kept)
    xy, visibility = pose.keypoints_of(points_part, rows)
    if frame.sent is None or frame.sent[0] <= 0 or frame.sent[1] <= 0:
        raise OutputError("the size of the image sent is unknown")
    if not (np.isfinite(xy).all() and np.isfinite(visibility).all()):
        raise OutputError(f"{plan.head} holds NaN or infinite keypoints")
    width, height = frame.sent
    yx = np.stack([xy[..., 1] / height, xy[..., 0] / width], axis=-1)
    _check_scores(visibility, f"{plan.head} keypoint visibility")
    return _instances(found, yx, visibility, names, skeleton, frame)


def _od(
    outputs: Mapping[str, Tensor], plan: KeypointPlan, frame: Frame, labels: Labels, kept: Kept
) -> Keypoints:
    assert plan.detection is not None
    assert plan.keypoints is not None and plan.keypoint_scores is not None
    keypoints = numbers(outputs, plan.keypoints)
    scores = numbers(outputs, plan.keypoint_scores)
    if keypoints.ndim != 4 or keypoints.shape[0] < 1 or keypoints.shape[3] != 2:
        raise OutputError(
            f"{plan.keypoints} has shape {list(keypoints.shape)}; expected [1, N, K, 2]"
        )
    if scores.shape != keypoints.shape[:3]:
        raise OutputError(
            f"{plan.keypoint_scores} {list(scores.shape)} does not match {plan.keypoints} "
            f"{list(keypoints.shape)}"
        )
    names, skeleton = _named(plan, keypoints.shape[2])
    found, rows, _ = map_decoded(outputs, plan.detection, frame, labels, kept)
    if len(rows) and int(rows.max()) >= keypoints.shape[1]:
        raise OutputError(
            f"{plan.keypoints} has {keypoints.shape[1]} rows but the detections have more"
        )
    yx = keypoints[0, rows].astype(np.float64)
    point_scores = scores[0, rows].astype(np.float64)
    if not np.isfinite(yx).all():
        raise OutputError(f"{plan.keypoints} holds NaN or infinite values")
    outside = (yx < -BOX_MARGIN) | (yx > 1 + BOX_MARGIN)
    if outside.any():
        row = int(rows[int(np.argmax(outside.any(axis=(1, 2))))])
        raise OutputError(
            f"{plan.keypoints}[{row}] holds values outside [0, 1]: keypoints must be "
            "normalized (y, x) of the image the model saw, as the OD API writes them"
        )
    _check_scores(point_scores, plan.keypoint_scores)
    return _instances(found, yx, point_scores, names, skeleton, frame)


def _check_scores(scores: np.ndarray, key: str) -> None:
    with np.errstate(invalid="ignore"):
        bad = ~((scores >= 0.0) & (scores <= 1.0))
    if bad.any():
        value = float(scores[bad][0])
        raise OutputError(f"{key} gives {value}; keypoint scores must be numbers in [0, 1]")


def _instances(
    found: list,  # detection.Detection, best first
    yx: np.ndarray,  # [n, K, 2] normalized (y, x) of the image the model saw
    scores: np.ndarray,  # [n, K]
    names: tuple[str, ...],
    skeleton: tuple[tuple[int, int], ...],
    frame: Frame,
) -> Keypoints:
    transform = frame.transform
    instances: list[Instance] = []
    for detection, points, point_scores in zip(found, yx.tolist(), scores.tolist(), strict=True):
        keypoints: list[Keypoint] = []
        for name, (y, x), score in zip(names, points, point_scores, strict=True):
            if transform is not None:
                y, x, _, _ = transform((y, x, y, x))
            x = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
            y = 0.0 if y < 0.0 else 1.0 if y > 1.0 else y
            keypoints.append(Keypoint(name, x * frame.width, y * frame.height, score))
        instances.append(
            Instance(detection.class_id, detection.label, detection.score, detection.box, keypoints)
        )
    return Keypoints(instances, skeleton)
