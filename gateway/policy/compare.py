"""A candidate model's answer compared with the current one's, in the task's own terms.

Detection: boxes match when they have the same label and an IoU of at least 0.5, paired
greedily from the highest IoU down (each box in at most one pair); precision is the share of
the candidate's boxes that match one of the current's, recall the share of the current's boxes
the candidate matched (1.0 when the side it divides by has no boxes: nothing to get wrong),
and each matched pair gives a score delta (candidate minus current).
Classification: whether the top-1 classes agree, and the overlap of the top-k classes (the
classes both lists name over the longer list's length; 1.0 when both are empty).
Plain Python on the tasks' result types: a shadow compares one image at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.tasks.classification.nouns import Classes
from gateway.tasks.detection.nouns import Detection, Detections

MATCH_IOU = 0.5


@dataclass(frozen=True)
class DetectionComparison:
    precision: float
    recall: float
    matched: int
    candidate_boxes: int
    current_boxes: int
    score_deltas: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ClassificationComparison:
    top1_agrees: bool
    topk_overlap: float


Comparison = DetectionComparison | ClassificationComparison


def iou(a: Detection, b: Detection) -> float:
    """Intersection over union of two detections' normalized boxes."""
    x0 = max(a.normalized.x_min, b.normalized.x_min)
    y0 = max(a.normalized.y_min, b.normalized.y_min)
    x1 = min(a.normalized.x_max, b.normalized.x_max)
    y1 = min(a.normalized.y_max, b.normalized.y_max)
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    if inter <= 0.0:
        return 0.0
    area_a = (a.normalized.x_max - a.normalized.x_min) * (a.normalized.y_max - a.normalized.y_min)
    area_b = (b.normalized.x_max - b.normalized.x_min) * (b.normalized.y_max - b.normalized.y_min)
    return inter / (area_a + area_b - inter)


def compare_detections(current: Detections, candidate: Detections) -> DetectionComparison:
    ours, theirs = current.detections, candidate.detections
    pairs = sorted(
        (
            (overlap, i, j)
            for i, a in enumerate(ours)
            for j, b in enumerate(theirs)
            if a.label == b.label and a.class_id == b.class_id
            if (overlap := iou(a, b)) >= MATCH_IOU
        ),
        key=lambda pair: -pair[0],
    )
    taken_current: set[int] = set()
    taken_candidate: set[int] = set()
    deltas: list[float] = []
    for _, i, j in pairs:
        if i in taken_current or j in taken_candidate:
            continue
        taken_current.add(i)
        taken_candidate.add(j)
        deltas.append(theirs[j].score - ours[i].score)
    matched = len(deltas)
    return DetectionComparison(
        precision=matched / len(theirs) if theirs else 1.0,
        recall=matched / len(ours) if ours else 1.0,
        matched=matched,
        candidate_boxes=len(theirs),
        current_boxes=len(ours),
        score_deltas=deltas,
    )


def compare_classes(current: Classes, candidate: Classes) -> ClassificationComparison:
    ours = [c.class_id if c.class_id >= 0 else c.label for c in current.classes]
    theirs = [c.class_id if c.class_id >= 0 else c.label for c in candidate.classes]
    top1 = (bool(ours) and bool(theirs) and ours[0] == theirs[0]) or (not ours and not theirs)
    longest = max(len(ours), len(theirs))
    overlap = len(set(ours) & set(theirs)) / longest if longest else 1.0
    return ClassificationComparison(top1_agrees=top1, topk_overlap=overlap)


def compare(current: object, candidate: object) -> Comparison | None:
    """The comparison of two results of one task; None for a task this module cannot compare
    (its shadow calls are still counted)."""
    if isinstance(current, Detections) and isinstance(candidate, Detections):
        return compare_detections(current, candidate)
    if isinstance(current, Classes) and isinstance(candidate, Classes):
        return compare_classes(current, candidate)
    return None
