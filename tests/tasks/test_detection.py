"""Mapping OD API outputs to pixel detections, and reading label maps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gateway.labels import Labels, LabelsError
from gateway.tasks.detection import OutputError, map_detections
from gateway.tasks.detection.nouns import Box

LABELS = Labels.parse_label_map(
    """
    item { id: 1 name: 'red_box' display_name: 'red box' }
    item { id: 2 name: 'green_box' }
    """
)


def outputs(rows: list[tuple[float, int, tuple[float, float, float, float]]], pad: int = 5):
    n = len(rows) + pad
    boxes = np.zeros((1, n, 4), np.float32)
    scores = np.zeros((1, n), np.float32)
    classes = np.zeros((1, n), np.float32)
    for i, (score, cls, box) in enumerate(rows):
        boxes[0, i], scores[0, i], classes[0, i] = box, score, cls
    return {
        "detection_boxes": boxes,
        "detection_scores": scores,
        "detection_classes": classes,
        "num_detections": np.array([len(rows)], np.float32),
    }


def test_normalized_boxes_become_pixels_of_the_image_max_exclusive() -> None:
    out = outputs([(0.9, 1, (0.1, 0.25, 0.5, 0.75))])
    [d] = map_detections(
        out, width=200, height=100, labels=LABELS, min_score=0.5, max_detections=10
    )
    assert d.box == Box(x_min=50, y_min=10, x_max=150, y_max=50)
    assert (d.class_id, d.label) == (1, "red box")
    assert d.normalized.x_min == pytest.approx(0.25)


def test_labels_fall_back_to_name_then_class_id() -> None:
    out = outputs([(0.9, 2, (0, 0, 1, 1)), (0.8, 7, (0, 0, 1, 1))])
    found = map_detections(out, width=4, height=4, labels=LABELS, min_score=0, max_detections=9)
    assert [d.label for d in found] == ["green_box", "class_7"]


def test_rows_after_num_detections_are_ignored_even_with_scores() -> None:
    out = outputs([(0.9, 1, (0, 0, 0.5, 0.5))])
    out["detection_scores"][0, 3] = 0.99  # padding row with a stray score
    found = map_detections(out, width=10, height=10, labels=LABELS, min_score=0, max_detections=9)
    assert len(found) == 1


def test_min_score_and_max_detections_keep_the_best() -> None:
    rows = [(s, 1, (0, 0, 1, 1)) for s in (0.95, 0.9, 0.7, 0.4, 0.2)]
    found = map_detections(
        outputs(rows), width=10, height=10, labels=LABELS, min_score=0.5, max_detections=2
    )
    assert [round(d.score, 2) for d in found] == [0.95, 0.9]


def test_boxes_a_little_past_the_border_are_clamped_to_the_image() -> None:
    out = outputs([(0.9, 1, (-0.04, -0.01, 1.05, 1.01))])
    [d] = map_detections(out, width=64, height=48, labels=LABELS, min_score=0, max_detections=1)
    assert d.box == Box(0, 0, 64, 48)


def test_boxes_far_outside_the_image_are_refused_as_not_normalized() -> None:
    out = outputs([(0.9, 1, (0.1, 0.1, 0.5, 0.5)), (0.8, 1, (12.0, 40.0, 120.0, 300.0))])
    with pytest.raises(
        OutputError, match=r"detection_boxes\[1\] is \[12, 40, 120, 300\].*not pixels"
    ):
        map_detections(out, width=64, height=48, labels=LABELS, min_score=0, max_detections=1)


def test_a_transform_maps_boxes_before_conversion() -> None:
    out = outputs([(0.9, 1, (0.0, 0.0, 0.5, 0.25))])
    [d] = map_detections(
        out,
        width=100,
        height=100,
        labels=LABELS,
        min_score=0,
        max_detections=1,
        transform=lambda b: (b[1], b[0], b[3], b[2]),  # transpose
    )
    assert d.box == Box(0, 0, 50, 25)


def test_outputs_with_wrong_shapes_are_reported() -> None:
    out = outputs([(0.9, 1, (0, 0, 1, 1))])
    out["detection_boxes"] = out["detection_boxes"][0]
    with pytest.raises(OutputError, match=r"detection_boxes has shape \[6, 4\]"):
        map_detections(out, width=1, height=1, labels=LABELS, min_score=0, max_detections=1)
    del out["num_detections"]
    with pytest.raises(OutputError, match="num_detections"):
        map_detections(out, width=1, height=1, labels=LABELS, min_score=0, max_detections=1)


def test_label_map_first_duplicate_wins_and_background_is_skipped() -> None:
    labels = Labels.parse_label_map(
        "item { id: 0 name: 'background' } item { id: 3 name: 'a' } item { id: 3 name: 'b' }"
        " item { id: 4 name: 'c' keypoints { id: 0 label: 'nose' } }"
    )
    assert labels.names == {3: "a", 4: "c"}


def test_label_map_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pbtxt"
    bad.write_text("item { id: -1 name: 'x' }")
    with pytest.raises(LabelsError, match=r"bad\.pbtxt: label map ids must be >= 0"):
        Labels.load_label_map(bad)
    bad.write_text("item { id: 1 name: ")
    with pytest.raises(LabelsError, match=r"bad\.pbtxt: not an OD API label map"):
        Labels.load_label_map(bad)
    with pytest.raises(LabelsError, match="cannot read label map"):
        Labels.load_label_map(tmp_path / "missing.pbtxt")


def test_the_shipped_label_map_parses() -> None:
    labels = Labels.load_label_map(
        Path(__file__).resolve().parents[2] / "serving" / "label_map.pbtxt"
    )
    assert sorted(labels.names) == [1, 2, 3, 4]
