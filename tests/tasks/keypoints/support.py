"""Outputs of keypoint models built by hand for the keypoints task's tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gateway.models import ModelConfig
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.keypoints import TASK
from gateway.tasks.keypoints.config import KeypointConfig
from gateway.upstream.signatures import Signature, TensorSpec

F = tfs.DT_FLOAT
# (cx, cy, w, h, class scores, [(x, y, visibility), ...]) in pixels of the image sent
Candidate = tuple[float, float, float, float, Sequence[float], Sequence[tuple[float, float, float]]]


def yolo_pose_head(candidates: Sequence[Candidate]) -> np.ndarray:
    """[1, 4 + classes + 3K, candidates], as an Ultralytics pose export with nms=False."""
    columns = []
    for cx, cy, w, h, scores, points in candidates:
        columns.append([cx, cy, w, h, *scores, *(v for point in points for v in point)])
    return np.asarray(columns, dtype=np.float32).T[None]


def signature(outputs: dict[str, TensorSpec]) -> Signature:
    return Signature("m", 3, {"images": TensorSpec(F, (1, 320, 320, 3))}, outputs)


def model(config: KeypointConfig | None = None) -> ModelConfig:
    return ModelConfig("m", TASK.name, task_config=config)
