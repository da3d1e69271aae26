"""Typed comparison of a shadow candidate's answer with the current model's, on hand-made
results."""

from __future__ import annotations

import pytest

from gateway.policy.compare import compare, compare_classes, compare_detections, iou
from gateway.tasks.classification.nouns import Classes, ScoredClass
from gateway.tasks.detection.nouns import Box, Detection, Detections, NormalizedBox


def det(label: str, score: float, x0: float, y0: float, x1: float, y1: float, cid: int = 1):
    box = Box(int(x0 * 100), int(y0 * 100), int(x1 * 100), int(y1 * 100))
    return Detection(cid, label, score, box, NormalizedBox(x0, y0, x1, y1))


def classes(*ids: int) -> Classes:
    return Classes([ScoredClass(i, f"c{i}", 1.0 / (n + 1)) for n, i in enumerate(ids)])


def test_iou_of_boxes():
    a = det("cat", 0.9, 0.0, 0.0, 0.5, 0.5)
    assert iou(a, a) == 1.0
    assert iou(a, det("cat", 0.9, 0.5, 0.5, 1.0, 1.0)) == 0.0
    # Half of a overlaps b, which is as large: 0.125 / (0.25 + 0.25 - 0.125) = 1/3.
    assert iou(a, det("cat", 0.9, 0.25, 0.0, 0.75, 0.5)) == pytest.approx(1 / 3)


def test_boxes_match_by_iou_and_label_and_give_precision_recall_and_score_deltas():
    current = Detections([
        det("cat", 0.9, 0.0, 0.0, 0.5, 0.5),
        det("dog", 0.8, 0.5, 0.5, 1.0, 1.0, cid=2),
        det("cat", 0.7, 0.0, 0.6, 0.3, 0.9),
    ])  # fmt: skip
    candidate = Detections([
        det("cat", 0.95, 0.02, 0.0, 0.52, 0.5),  # matches the first (IoU ~0.92)
        det("cat", 0.6, 0.5, 0.5, 1.0, 1.0),  # where the dog is, but another label: no match
        det("cat", 0.5, 0.2, 0.6, 0.5, 0.9),  # IoU 0.2 with the third: no match
        det("bird", 0.4, 0.9, 0.9, 1.0, 1.0, cid=3),
    ])  # fmt: skip
    result = compare_detections(current, candidate)
    assert (result.matched, result.candidate_boxes, result.current_boxes) == (1, 4, 3)
    assert result.precision == 0.25
    assert result.recall == pytest.approx(1 / 3)
    assert result.score_deltas == [pytest.approx(0.05)]


def test_each_box_is_matched_once_best_iou_first():
    current = Detections([det("cat", 0.5, 0.0, 0.0, 0.5, 0.5)])
    candidate = Detections([
        det("cat", 0.6, 0.05, 0.0, 0.55, 0.5),  # IoU ~0.82
        det("cat", 0.7, 0.0, 0.0, 0.5, 0.5),  # IoU 1: this one pairs
    ])  # fmt: skip
    result = compare_detections(current, candidate)
    assert result.matched == 1
    assert result.score_deltas == [pytest.approx(0.2)]
    assert (result.precision, result.recall) == (0.5, 1.0)


def test_empty_sides_count_as_nothing_to_get_wrong():
    boxes = Detections([det("cat", 0.9, 0.0, 0.0, 0.5, 0.5)])
    assert compare_detections(Detections([]), Detections([])).precision == 1.0
    missed = compare_detections(boxes, Detections([]))
    assert (missed.precision, missed.recall) == (1.0, 0.0)
    invented = compare_detections(Detections([]), boxes)
    assert (invented.precision, invented.recall) == (0.0, 1.0)


def test_classes_top1_agreement_and_topk_overlap():
    same = compare_classes(classes(3, 1, 2), classes(3, 2, 7))
    assert same.top1_agrees
    assert same.topk_overlap == pytest.approx(2 / 3)
    other = compare_classes(classes(3, 1), classes(1, 3, 5, 6))
    assert not other.top1_agrees
    assert other.topk_overlap == 0.5
    assert compare_classes(classes(), classes()).top1_agrees
    assert not compare_classes(classes(1), classes()).top1_agrees


def test_results_of_other_types_are_not_compared():
    assert compare({"embedding": [1.0]}, {"embedding": [1.0]}) is None
    assert compare(classes(1), Detections([])) is None
