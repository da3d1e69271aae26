"""The raw head of YOLOv5u/v8/v11 exports: `[batch, 4 + classes, candidates]`.

Each candidate is a column: centre x, centre y, width, height in pixels of the image the model
received, then one score per class (already through a sigmoid in the graph). A candidate's
class is its best-scoring one; candidates under `min_score` are dropped first, at most
`max_candidates` of the rest (best first) go through class-wise NMS.
"""

from __future__ import annotations

import numpy as np

from gateway.tasks.decoders import boxes, nms


class Decoded:
    """Detections of one image: yxyx boxes in pixels of the image sent, best first, and the
    candidates (columns of the head) they are."""

    __slots__ = ("boxes", "classes", "rows", "scores")

    def __init__(
        self, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, rows: np.ndarray
    ) -> None:
        self.boxes = boxes
        self.scores = scores
        self.classes = classes
        self.rows = rows


def decode(
    head: np.ndarray,
    *,
    min_score: float,
    nms_iou: float,
    max_candidates: int,
    max_detections: int,
) -> Decoded:
    """Decodes one image's head, `head` [4 + classes, candidates] (the first batch item)."""
    if head.ndim != 2 or head.shape[0] < 5:
        raise ValueError(f"expected [4 + classes, candidates], got {list(head.shape)}")
    class_scores = head[4:]
    classes = np.argmax(class_scores, axis=0)
    scores = class_scores[classes, np.arange(head.shape[1])].astype(np.float64)
    candidates = np.flatnonzero(scores >= min_score)
    if len(candidates) > max_candidates:
        best = np.argsort(-scores[candidates], kind="stable")[:max_candidates]
        candidates = np.sort(candidates[best])
    yxyx = boxes.to_yxyx(head[:4, candidates].T, "cxcywh")
    kept = nms.non_max_suppression(
        yxyx, scores[candidates], classes[candidates], nms_iou, max_detections
    )
    chosen = candidates[kept]
    return Decoded(yxyx[kept], scores[chosen], classes[chosen], chosen)
