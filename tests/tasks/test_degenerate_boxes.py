"""One rule for boxes with no area, in every task built on detection (docs/models.md,
"Boxes with no area"): an instance whose box has no height or no width in the image (as the
model gave it, or once clamped to the image: on or past an edge) is kept, as the model
answered it, with its class and score: detection returns the box (x_min == x_max or y_min
== y_max), keypoints its points, instance segmentation its mask as the paste gives it, empty
where no pixel is covered (Model Garden's paste_instance_masks keeps it so too, the COCO
evaluation scoring it). Each form: OD API-style outputs (and box-relative masks) and the YOLO
heads (detection's `yolo`, `yolo-pose`, `yolo-seg` in both mask resolutions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.config import Settings
from gateway.domain import Frame
from gateway.models import ModelConfig
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.detection import TASK as DETECTION
from gateway.tasks.keypoints import TASK as KEYPOINTS
from gateway.tasks.segmentation import TASK as SEGMENTATION
from gateway.upstream.signatures import Signature, TensorSpec
from tests.support import masks

WIDTH, HEIGHT = 64, 48  # shown and sent alike
# Normalized (ymin, xmin, ymax, xmax) rows: zero height on the bottom edge (as the Model
# Garden Mask R-CNN answered), past the bottom edge (clamped to zero height), zero width
# inside, and an ordinary box.
OD_BOXES = [
    (1.0, 0.2, 1.0, 0.5),
    (1.01, 0.1, 1.04, 0.3),
    (0.2, 0.4, 0.6, 0.4),
    (0.1, 0.1, 0.5, 0.5),
]
# The pixel boxes (x_min, y_min, x_max, y_max) every task answers for them.
PIXELS = [(13, 48, 32, 48), (6, 48, 19, 48), (26, 10, 26, 29), (6, 5, 32, 24)]
SCORES = [0.9, 0.8, 0.7, 0.6]


def run(task: Any, table: dict[str, Any], found: dict[str, np.ndarray], **asked: Any) -> Any:
    config = ModelConfig("m", task.name, task_config=task.read_config(
        {"task": task.name, **table}, Path("models.toml"), "models.m"))  # fmt: skip
    specs = {k: TensorSpec(tfs.DT_FLOAT, tuple(v.shape)) for k, v in found.items()}
    signature = Signature("m", 1, {"images": TensorSpec(tfs.DT_UINT8, (1, -1, -1, 3))}, specs)
    plan = task.output_plan(signature, config)
    asking = task.binding.options_type(min_score=0.5, **asked)
    options = task.resolve(asking, config, config.rules(Settings()))
    return task.map(found, plan, Frame(WIDTH, HEIGHT, None, (WIDTH, HEIGHT)), options, config)


def od_outputs(**extra: np.ndarray) -> dict[str, np.ndarray]:
    n = len(OD_BOXES)
    return {
        "detection_boxes": np.asarray([OD_BOXES], np.float32),
        "detection_scores": np.asarray([SCORES], np.float32),
        "detection_classes": np.ones((1, n), np.float32),
        "num_detections": np.asarray([n], np.float32),
        **extra,
    }


def yolo_head(extra_rows: list[list[float]]) -> np.ndarray:
    """[1, 4 + 1 + extra, candidates]: the OD boxes as cx, cy, w, h in pixels, far apart
    enough that NMS keeps them all, one class, then each candidate's extra values."""
    columns = []
    for (ymin, xmin, ymax, xmax), score, extra in zip(OD_BOXES, SCORES, extra_rows, strict=True):
        cx, cy = (xmin + xmax) / 2 * WIDTH, (ymin + ymax) / 2 * HEIGHT
        columns.append([cx, cy, (xmax - xmin) * WIDTH, (ymax - ymin) * HEIGHT, score, *extra])
    return np.asarray(columns, np.float32).T[None]


def pixels(instances: Any) -> list[tuple[int, int, int, int]]:
    return [(b.x_min, b.y_min, b.x_max, b.y_max) for b in (i.box for i in instances)]


def areas(instances: Any) -> list[int]:
    """Each instance's mask area, whichever format it is written in."""
    found = []
    for i in instances:
        if i.mask.counts is not None:
            pixels = masks.rle_decode([i.mask.height, i.mask.width], i.mask.counts)
        elif i.mask.png is not None:
            pixels = masks.png_mask(i.mask.png)
        else:
            pixels = masks.polygons_mask(i.mask.polygons or [], i.mask.height, i.mask.width)
        assert pixels.shape == (HEIGHT, WIDTH)
        found.append(int(pixels.sum()))
    return found


def test_detection_keeps_boxes_with_no_area() -> None:
    for table, found in (
        ({}, od_outputs()),
        ({"outputs": {"decoder": "yolo"}}, {"output0": yolo_head([[]] * 4)}),
    ):
        result = run(DETECTION, table, found)
        assert pixels(result.detections) == PIXELS
        assert [round(d.score, 3) for d in result.detections] == SCORES


def test_keypoints_keep_instances_whose_box_has_no_area() -> None:
    points = np.tile(np.asarray([[[0.99, 0.3]] * 17], np.float32), (len(OD_BOXES), 1, 1))
    od = od_outputs(detection_keypoints=points[None],
                    detection_keypoint_scores=np.full((1, 4, 17), 0.9, np.float32))  # fmt: skip
    pose = yolo_head([[20.0, 47.0, 0.9] * 17] * 4)
    for table, found in (({}, od), ({"outputs": {"decoder": "yolo-pose"}}, {"output0": pose})):
        result = run(KEYPOINTS, table, found)
        assert pixels(result.instances) == PIXELS
        assert all(len(i.keypoints) == 17 for i in result.instances)


def test_segmentation_keeps_them_with_the_mask_the_paste_gives() -> None:
    grids = np.ones((1, len(OD_BOXES), 4, 4), np.float32)
    result = run(SEGMENTATION, {}, od_outputs(detection_masks=grids))
    assert pixels(result.instances) == PIXELS
    # Model Garden's paste (the box grown by (m + 2) / m, at least a pixel each way): nothing
    # of the image under the bottom edge; a column one pixel wide for the zero-width box.
    # official/vision/ops/mask_ops.py paste_instance_masks gives these areas for these boxes
    # and grids (run in .venv-zoo).
    assert areas(result.instances) == [0, 0, 20, 471]


@pytest.mark.parametrize("resolution", ["native", "input"])
def test_yolo_seg_keeps_them_with_an_empty_mask(resolution: str) -> None:
    protos = np.full((1, 1, HEIGHT // 4, WIDTH // 4), 5.0, np.float32)  # every pixel in
    table = {"outputs": {"decoder": "yolo-seg", "mask_resolution": resolution}}
    found = {"output0": yolo_head([[1.0]] * 4), "output1": protos}
    for mask_format in ("rle", "polygon", "png"):
        result = run(SEGMENTATION, table, found, mask_format=mask_format)
        assert pixels(result.instances) == PIXELS
        assert areas(result.instances)[:3] == [0, 0, 0] and areas(result.instances)[3] > 0
