"""A shadow candidate's detections compared with the current model's (Task.compare).

Boxes match when they have the same class and an IoU of at least 0.5, paired greedily from the
highest IoU down (each box in at most one pair); precision is the share of the candidate's
boxes that match one of the current's, recall the share of the current's boxes the candidate
matched (1.0 when the side it divides by has no boxes: nothing to get wrong), and each matched
pair gives a score delta (candidate minus current). The IoU of every pair is one numpy
expression; the greedy pass visits only the pairs at or above the threshold, so a thousand
boxes a side (the gateway's ceiling on max_detections) compare in milliseconds. Keypoints
and segmentation match their instances the same way (`match`).
"""

from __future__ import annotations

import numpy as np

from gateway.domain import Comparison
from gateway.tasks.detection.nouns import Detections

MATCH_IOU = 0.5


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of `a` [n, 4] with every box of `b` [m, 4] (x_min, y_min, x_max,
    y_max): [n, m]."""
    x0 = np.maximum(a[:, None, 0], b[None, :, 0])
    y0 = np.maximum(a[:, None, 1], b[None, :, 1])
    x1 = np.minimum(a[:, None, 2], b[None, :, 2])
    y1 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x1 - x0, 0.0, None) * np.clip(y1 - y0, 0.0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def match(overlap: np.ndarray, threshold: float = MATCH_IOU) -> list[tuple[int, int]]:
    """Greedy pairs (i, j) from the highest overlap down, each index at most once, among the
    pairs at or above `threshold` (overlap [n, m]; 0 where the classes differ)."""
    rows, cols = np.nonzero(overlap >= threshold)
    if len(rows) == 0:
        return []
    order = np.argsort(-overlap[rows, cols], kind="stable")
    taken_i = np.zeros(overlap.shape[0], bool)
    taken_j = np.zeros(overlap.shape[1], bool)
    pairs: list[tuple[int, int]] = []
    most = min(overlap.shape)
    for i, j in zip(rows[order].tolist(), cols[order].tolist(), strict=True):
        if taken_i[i] or taken_j[j]:
            continue
        taken_i[i] = taken_j[j] = True
        pairs.append((i, j))
        if len(pairs) == most:
            break
    return pairs


def same_class(current: list[tuple[int, str]], candidate: list[tuple[int, str]]) -> np.ndarray:
    """[n, m] True where the classes (class_id, label) agree."""
    ids = {key: k for k, key in enumerate(dict.fromkeys(current + candidate))}
    a = np.array([ids[key] for key in current], np.int64)
    b = np.array([ids[key] for key in candidate], np.int64)
    return a[:, None] == b[None, :]


def matched(
    task: str,
    pairs: list[tuple[int, int]],
    current_scores: list[float],
    candidate_scores: list[float],
    extra: dict[str, float] | None = None,
) -> Comparison:
    """Precision, recall and score deltas of the instances paired by `match`, plus any
    `extra` measures."""
    n, m = len(current_scores), len(candidate_scores)
    measures = {
        "precision": len(pairs) / m if m else 1.0,
        "recall": len(pairs) / n if n else 1.0,
        **(extra or {}),
    }
    deltas = tuple(candidate_scores[j] - current_scores[i] for i, j in pairs)
    return Comparison(task, measures, deltas)


def compare_detections(current: Detections, candidate: Detections) -> Comparison:
    ours, theirs = current.detections, candidate.detections
    a = np.array([d.normalized for d in ours], np.float64).reshape(-1, 4)
    b = np.array([d.normalized for d in theirs], np.float64).reshape(-1, 4)
    classes = same_class([(d.class_id, d.label) for d in ours],
                         [(d.class_id, d.label) for d in theirs])  # fmt: skip
    overlap = np.where(classes, box_iou(a, b), 0.0)
    return matched("detection", match(overlap), [d.score for d in ours], [d.score for d in theirs])
