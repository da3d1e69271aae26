"""The keypoints of a YOLOv8/11-pose raw head: `[4 + classes + 3K, candidates]` per image.

After the box (cx, cy, w, h) and the class scores, each candidate has K (x, y, visibility)
triples: x and y in pixels of the image the model received, visibility already through a
sigmoid, as Ultralytics' Pose head exports them (ultralytics/nn/modules/head.py,
Pose.kpts_decode: `(raw * 2 + anchor - 0.5) * stride` for x and y, sigmoid for the third).
The box and class rows decode as detection's YOLO head (gateway.tasks.decoders.yolo); the
candidates kept there pick their keypoints here.
"""

from __future__ import annotations

import numpy as np

PER_POINT = 3  # x, y, visibility


def split_head(head: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """[4 + classes + 3K, candidates] -> the box and class rows [4 + classes, candidates] and
    the keypoints [K, 3, candidates]. ValueError when the rows cannot hold K points and a
    class."""
    if head.ndim != 2 or points < 1 or head.shape[0] < 5 + PER_POINT * points:
        raise ValueError(
            f"{list(head.shape)} cannot hold 4 box values, a class score and {points} "
            f"keypoints of {PER_POINT} values"
        )
    split = head.shape[0] - PER_POINT * points
    return head[:split], head[split:].reshape(points, PER_POINT, head.shape[1])


def keypoints_of(points: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keypoints of `candidates` (columns): [n, K, 2] (x, y) in pixels of the image sent
    and [n, K] visibility scores."""
    chosen = points[:, :, candidates].astype(np.float64)  # [K, 3, n]
    xy = chosen[:, :2].transpose(2, 0, 1)
    return xy, chosen[:, 2].T
