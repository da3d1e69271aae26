"""The output decoders (gateway.tasks.decoders) against hand-computed values and, for NMS,
TensorFlow's own tf.image.non_max_suppression run per class."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from gateway.tasks.decoders import boxes, nms, scores, yolo


@pytest.mark.parametrize(
    ("box_format", "box"),
    [
        ("yxyx", [10, 20, 50, 80]),
        ("xyxy", [20, 10, 80, 50]),
        ("xywh", [20, 10, 60, 40]),
        ("cxcywh", [50, 30, 60, 40]),
    ],
)
def test_every_box_format_gives_the_same_yxyx_box(box_format: str, box: list[float]) -> None:
    assert boxes.to_yxyx(np.array([box]), box_format).tolist() == [[10, 20, 50, 80]]


def test_pixel_boxes_are_normalized_by_the_size_of_the_image_sent() -> None:
    yxyx = np.array([[10.0, 20.0, 50.0, 80.0]])
    got = boxes.normalize(yxyx, "pixels", sent_size=(160, 100))
    assert got.tolist() == [[0.1, 0.125, 0.5, 0.5]]
    with pytest.raises(boxes.BoxError):
        boxes.normalize(yxyx, "pixels", sent_size=None)


def test_image_info_undoes_model_gardens_rescaling() -> None:
    # A 480x640 (h x w) image scaled by 0.4 into a 256x256 input: a box at [40, 80, 120, 240]
    # of the scaled input is [100, 200, 300, 600] of the original.
    info = np.array([[480, 640], [192, 256], [0.4, 0.4], [0, 0]], dtype=np.float32)
    got = boxes.normalize(np.array([[40.0, 80.0, 120.0, 240.0]]), "image_info", image_info=info)
    np.testing.assert_allclose(got, [[100 / 480, 200 / 640, 300 / 480, 600 / 640]], rtol=1e-6)


def test_unusable_image_info_is_refused() -> None:
    with pytest.raises(boxes.BoxError, match="positive"):
        boxes.normalize(np.zeros((1, 4)), "image_info", image_info=np.zeros((4, 2)))
    with pytest.raises(boxes.BoxError, match="expected"):
        boxes.normalize(np.zeros((1, 4)), "image_info", image_info=np.zeros(3))


def test_softmax_and_sigmoid() -> None:
    logits = np.array([2.0, 0.0, -1000.0])
    np.testing.assert_allclose(scores.softmax(logits), [0.880797, 0.119203, 0.0], atol=1e-6)
    np.testing.assert_allclose(scores.sigmoid(logits), [0.880797, 0.5, 0.0], atol=1e-6)
    assert scores.activate(logits, "sigmoid").sum() > 1  # multi-label: independent scores


def _random_boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    """Boxes clustered on a few spots so that many overlap; some with corners swapped."""
    centres = rng.uniform(50, 450, (6, 2))[rng.integers(0, 6, n)]
    centres += rng.normal(0, 8, (n, 2))
    sizes = rng.uniform(20, 90, (n, 2))
    yxyx = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1)
    swapped = rng.random(n) < 0.1
    yxyx[swapped] = yxyx[swapped][:, [2, 3, 0, 1]]
    return yxyx


def _tf_classwise_nms(
    yxyx: np.ndarray, score: np.ndarray, classes: np.ndarray, iou: float, max_output: int
) -> list[int]:
    kept: list[int] = []
    for c in np.unique(classes):
        members = np.flatnonzero(classes == c)
        chosen = tf.image.non_max_suppression(
            yxyx[members].astype(np.float32), score[members].astype(np.float32), len(members),
            iou_threshold=iou,
        ).numpy()  # fmt: skip
        kept.extend(members[chosen].tolist())
    kept.sort(key=lambda i: -score[i])
    return kept[:max_output]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("iou", [0.3, 0.45, 0.7])
def test_classwise_nms_keeps_what_tensorflow_keeps_per_class(seed: int, iou: float) -> None:
    rng = np.random.default_rng(seed)
    n = 300
    yxyx = _random_boxes(rng, n)
    score = rng.permutation(n) / n + 0.001  # distinct scores: no tie-breaking questions
    classes = rng.integers(0, 4, n)
    got = nms.non_max_suppression(yxyx, score, classes, iou, 50)
    assert got.tolist() == _tf_classwise_nms(yxyx, score, classes, iou, 50)


def test_boxes_without_area_suppress_nothing() -> None:
    yxyx = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [5, 5, 5, 5], [5, 5, 5, 5]], float)
    got = nms.non_max_suppression(yxyx, np.array([0.9, 0.8, 0.7, 0.6]), np.zeros(4), 0.5, 10)
    assert got.tolist() == [0, 2, 3]


def test_yolo_head_decodes_like_tensorflow_per_class() -> None:
    rng = np.random.default_rng(7)
    classes, candidates = 5, 2000
    centres = _random_boxes(rng, candidates)
    cy, cx = (centres[:, 0] + centres[:, 2]) / 2, (centres[:, 1] + centres[:, 3]) / 2
    h, w = np.abs(centres[:, 2] - centres[:, 0]), np.abs(centres[:, 3] - centres[:, 1])
    class_scores = rng.random((classes, candidates)) ** 3
    head = np.concatenate([np.stack([cx, cy, w, h]), class_scores]).astype(np.float32)

    got = yolo.decode(head, min_score=0.25, nms_iou=0.45, max_candidates=600, max_detections=100)

    best = class_scores.argmax(axis=0)
    score = class_scores.max(axis=0).astype(np.float32).astype(np.float64)
    passing = np.flatnonzero(score >= 0.25)
    passing = passing[np.argsort(-score[passing], kind="stable")[:600]]
    yxyx = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)[passing]
    expected = passing[_tf_classwise_nms(yxyx, score[passing], best[passing], 0.45, 100)]
    assert len(got.scores) == len(expected) > 10
    np.testing.assert_allclose(got.scores, score[expected])
    assert got.classes.tolist() == best[expected].tolist()
    want = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)[expected]
    np.testing.assert_allclose(got.boxes, want, atol=1e-3)


def test_yolo_head_with_nothing_above_min_score_gives_nothing() -> None:
    head = np.zeros((8, 100), np.float32)
    got = yolo.decode(head, min_score=0.5, nms_iou=0.45, max_candidates=10, max_detections=10)
    assert got.boxes.shape == (0, 4) and got.scores.size == 0
