"""A shadow candidate's keypoint instances compared with the current model's (Task.compare):
instances matched as detection matches boxes (same class, box IoU >= 0.5, greedy), giving
precision, recall and score deltas; and per matched pair the object keypoint similarity
(COCO's OKS with one falloff for every keypoint: the mean of exp(-d^2 / (2 s^2 k^2)) over the
keypoints both name, s^2 the current box's area in pixels, k = 0.1), averaged over the pairs
as `keypoint_similarity` (1.0 with no pair)."""

from __future__ import annotations

import numpy as np

from gateway.domain import Comparison
from gateway.tasks.detection.compare import box_iou, match, matched, same_class
from gateway.tasks.keypoints.nouns import Instance, Keypoints

FALLOFF = 0.1  # COCO's per-keypoint constants are 0.025-0.107; one value for any skeleton


def _boxes(instances: list[Instance]) -> np.ndarray:
    return np.array([i.box for i in instances], np.float64).reshape(-1, 4)


def similarity(a: Instance, b: Instance) -> float:
    """OKS of two instances' keypoints (by name), with `a`'s box as the scale."""
    theirs = {k.name: (k.x, k.y) for k in b.keypoints}
    shared = [(k.x, k.y, *theirs[k.name]) for k in a.keypoints if k.name in theirs]
    if not shared:
        return 0.0
    points = np.array(shared, np.float64)
    area = max(1.0, float((a.box.x_max - a.box.x_min) * (a.box.y_max - a.box.y_min)))
    d2 = (points[:, 0] - points[:, 2]) ** 2 + (points[:, 1] - points[:, 3]) ** 2
    return float(np.mean(np.exp(-d2 / (2 * area * FALLOFF**2))))


def compare_keypoints(current: Keypoints, candidate: Keypoints) -> Comparison:
    ours, theirs = current.instances, candidate.instances
    classes = same_class([(i.class_id, i.label) for i in ours],
                         [(i.class_id, i.label) for i in theirs])  # fmt: skip
    overlap = np.where(classes, box_iou(_boxes(ours), _boxes(theirs)), 0.0)
    pairs = match(overlap)
    oks = [similarity(ours[i], theirs[j]) for i, j in pairs]
    extra = {"keypoint_similarity": float(np.mean(oks)) if oks else 1.0}
    return matched("keypoints", pairs, [i.score for i in ours], [i.score for i in theirs],
                   extra)  # fmt: skip
