"""Each task's comparison of a shadow candidate's answer with the current model's
(Task.compare), on hand-made results: detection and keypoints match instances by box IoU and
class, segmentation by box then mask IoU, classification top-1 and top-k, embedding cosine;
and a thousand boxes a side compare in well under a second (it was 6.9 s of Python on the
event loop, issue 42)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gateway.tasks.builtin import built_in_tasks
from gateway.tasks.classification.nouns import Classes, ScoredClass
from gateway.tasks.detection.compare import box_iou
from gateway.tasks.detection.nouns import Box, Detection, Detections, NormalizedBox
from gateway.tasks.embedding.nouns import Embedding
from gateway.tasks.keypoints.nouns import Instance as PoseInstance
from gateway.tasks.keypoints.nouns import Keypoint, Keypoints
from gateway.tasks.segmentation import encode
from gateway.tasks.segmentation.nouns import Instance, Mask, Segments
from gateway.tasks.segmentation.raster import Placed

TASKS = built_in_tasks()
DETECTION = TASKS["detection"]


def det(label: str, score: float, x0: float, y0: float, x1: float, y1: float, cid: int = 1):
    box = Box(int(x0 * 100), int(y0 * 100), int(x1 * 100), int(y1 * 100))
    return Detection(cid, label, score, box, NormalizedBox(x0, y0, x1, y1))


def classes(*ids: int) -> Classes:
    return Classes([ScoredClass(i, f"c{i}", 1.0 / (n + 1)) for n, i in enumerate(ids)])


def test_every_task_compares():
    assert all(callable(getattr(task, "compare", None)) for task in TASKS.values())


def test_iou_of_boxes():
    a = np.array([[0.0, 0.0, 0.5, 0.5]])
    assert box_iou(a, a)[0, 0] == 1.0
    assert box_iou(a, np.array([[0.5, 0.5, 1.0, 1.0]]))[0, 0] == 0.0
    # Half of a overlaps b, which is as large: 0.125 / (0.25 + 0.25 - 0.125) = 1/3.
    assert box_iou(a, np.array([[0.25, 0.0, 0.75, 0.5]]))[0, 0] == pytest.approx(1 / 3)


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
    result = DETECTION.compare(current, candidate)
    assert result.task == "detection"
    assert result.measures["precision"] == 0.25
    assert result.measures["recall"] == pytest.approx(1 / 3)
    assert result.score_deltas == (pytest.approx(0.05),)


def test_each_box_is_matched_once_best_iou_first():
    current = Detections([det("cat", 0.5, 0.0, 0.0, 0.5, 0.5)])
    candidate = Detections([
        det("cat", 0.6, 0.05, 0.0, 0.55, 0.5),  # IoU ~0.82
        det("cat", 0.7, 0.0, 0.0, 0.5, 0.5),  # IoU 1: this one pairs
    ])  # fmt: skip
    result = DETECTION.compare(current, candidate)
    assert result.score_deltas == (pytest.approx(0.2),)
    assert (result.measures["precision"], result.measures["recall"]) == (0.5, 1.0)


def test_empty_sides_count_as_nothing_to_get_wrong():
    boxes = Detections([det("cat", 0.9, 0.0, 0.0, 0.5, 0.5)])
    assert DETECTION.compare(Detections([]), Detections([])).measures["precision"] == 1.0
    missed = DETECTION.compare(boxes, Detections([])).measures
    assert (missed["precision"], missed["recall"]) == (1.0, 0.0)
    invented = DETECTION.compare(Detections([]), boxes).measures
    assert (invented["precision"], invented["recall"]) == (0.0, 1.0)


def test_a_thousand_boxes_a_side_compare_in_milliseconds():
    rng = np.random.default_rng(0)
    corners = rng.random((1000, 2)) * 0.9
    same = [det("cat", 0.5, x, y, x + 0.1, y + 0.1) for x, y in corners.tolist()]
    # The worst case for a greedy matching: every box overlaps every other one.
    stacked = [det("cat", 0.5, 0.0, 0.0, 1.0, 1.0) for _ in range(1000)]
    for current in (same, stacked):
        started = time.process_time()
        result = DETECTION.compare(Detections(current), Detections(list(current)))
        took = time.process_time() - started
        assert result.measures["precision"] == 1.0 and len(result.score_deltas) == 1000
        assert took < 1.0, f"{took:.2f} s of CPU for 1000 x 1000 boxes"


def test_classes_top1_agreement_and_topk_overlap():
    compare = TASKS["classification"].compare
    same = compare(classes(3, 1, 2), classes(3, 2, 7)).measures
    assert same["top1_agreement"] == 1.0
    assert same["topk_overlap"] == pytest.approx(2 / 3)
    other = compare(classes(3, 1), classes(1, 3, 5, 6)).measures
    assert other["top1_agreement"] == 0.0 and other["topk_overlap"] == 0.5
    assert compare(classes(), classes()).measures["top1_agreement"] == 1.0
    assert compare(classes(1), classes()).measures["top1_agreement"] == 0.0


def test_embeddings_compare_by_cosine_similarity():
    compare = TASKS["embedding"].compare
    assert compare(Embedding([1.0, 0.0], True), Embedding([1.0, 0.0], True)).measures == {
        "cosine_similarity": 1.0, "same_dimension": 1.0}  # fmt: skip
    turned = compare(Embedding([1.0, 0.0], True), Embedding([0.6, 0.8], True)).measures
    assert turned["cosine_similarity"] == pytest.approx(0.6)
    other = compare(Embedding([1.0, 0.0], True), Embedding([1.0, 0.0, 0.0], True)).measures
    assert other == {"cosine_similarity": 0.0, "same_dimension": 0.0}


def pose(score: float, box: Box, points: list[tuple[float, float]]) -> PoseInstance:
    named = [Keypoint(f"p{i}", x, y, 1.0) for i, (x, y) in enumerate(points)]
    return PoseInstance(0, "person", score, box, named)


def test_keypoints_match_instances_and_measure_keypoint_similarity():
    compare = TASKS["keypoints"].compare
    box = Box(0, 0, 100, 100)
    current = Keypoints([pose(0.9, box, [(10, 10), (50, 50)])], ())
    exact = compare(current, Keypoints([pose(0.8, box, [(10, 10), (50, 50)])], ())).measures
    assert exact["keypoint_similarity"] == 1.0 and exact["precision"] == 1.0
    # 10 px off on a 100 px box: exp(-100 / (2 * 10000 * 0.01)) = exp(-0.5) for each point.
    off = compare(current, Keypoints([pose(0.8, box, [(20, 10), (50, 60)])], ())).measures
    assert off["keypoint_similarity"] == pytest.approx(np.exp(-0.5))


def rle_instance(score: float, bits: np.ndarray, box: Box) -> Instance:
    h, w = bits.shape
    counts = encode.rle_string(encode.rle_counts(Placed(0, 0, bits), w, h))
    return Instance(1, "thing", score, box, Mask(h, w, counts=counts))


def test_segments_match_by_box_then_compare_their_masks():
    compare = TASKS["instance_segmentation"].compare
    a = np.zeros((40, 60), bool)
    a[10:30, 10:30] = True  # 400 pixels
    b = np.zeros((40, 60), bool)
    b[10:30, 15:35] = True  # 400 pixels, 300 shared: IoU 300 / 500
    box = Box(10, 10, 30, 30)
    result = compare(Segments([rle_instance(0.9, a, box)]), Segments([rle_instance(0.7, b, box)]))
    assert result.measures["precision"] == 1.0
    assert result.measures["mask_iou"] == pytest.approx(0.6)
    assert result.score_deltas == (pytest.approx(-0.2),)
