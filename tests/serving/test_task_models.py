"""The reference models of the other three tasks, exported (the session's model repository),
answer exactly what numpy computes from their input (tests/support/referencemodels.py): the
Mask R-CNN-style segmenter, the YOLOv8-pose-layout keypoint model and the embedder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from serving import scenes
from tests.support import referencemodels

pytestmark = pytest.mark.slow

Function = Callable[..., dict[str, Any]]


def load(model_repo: Path, name: str) -> Function:
    return tf.saved_model.load(str(model_repo / name / "1")).signatures["serving_default"]


@pytest.fixture(scope="module")
def segmenter(model_repo: Path) -> Function:
    return load(model_repo, "maskrcnn")


@pytest.fixture(scope="module")
def pose(model_repo: Path) -> Function:
    return load(model_repo, "pose")


def grey(width: int, height: int) -> np.ndarray:
    return np.full((height, width, 3), scenes.SHAPES_BACKGROUND, np.uint8)


SEGMENTER_PICTURES = {
    "shapes": scenes.shapes_scene().pixels,
    "small, odd size": scenes.shapes_scene(203, 151).pixels,
    "shapes cut by the edges": scenes.shapes_scene().pixels[40:-30, 90:-60],
    "rectangles": scenes.generate_scene(np.random.default_rng(3), 320, 240, 6).pixels,
    "no palette colour": grey(64, 48),
}


@pytest.mark.parametrize("picture", list(SEGMENTER_PICTURES))
def test_segmenter_answers_the_shapes_as_numpy_does(segmenter: Function, picture: str) -> None:
    pixels = SEGMENTER_PICTURES[picture]
    got = {k: v.numpy()[0] for k, v in segmenter(input_tensor=tf.constant(pixels[None])).items()}
    want = referencemodels.segmenter(pixels)
    assert got["num_detections"] == want["num_detections"]
    np.testing.assert_array_equal(got["detection_classes"], want["detection_classes"])
    np.testing.assert_allclose(got["detection_boxes"], want["detection_boxes"], atol=1e-6)
    np.testing.assert_allclose(got["detection_scores"], want["detection_scores"], atol=1e-6)
    # crop_and_resize maps the sample positions in float32: 3e-5 apart at most.
    np.testing.assert_allclose(got["detection_masks"], want["detection_masks"], atol=1e-4)


def test_segmenter_masks_are_the_shapes(segmenter: Function) -> None:
    """Each of shapes.jpg's four shapes is one instance with its own box, and its mask keeps
    its form: the ring's centre and the L's missing corner are empty, the bar is full."""
    scene = scenes.shapes_scene()
    out = segmenter(input_tensor=tf.constant(scene.pixels[None]))
    classes = out["detection_classes"].numpy()[0, :4].astype(int).tolist()
    assert sorted(classes) == [1, 2, 3, 4] and out["num_detections"].numpy()[0] == 4
    size = np.array([scene.height, scene.width, scene.height, scene.width])
    for row, class_id in enumerate(classes):
        truth = next(b for b in scene.boxes if b.class_id == class_id)
        box = out["detection_boxes"].numpy()[0, row] * size
        np.testing.assert_allclose(
            box, [truth.y_min, truth.x_min, truth.y_max, truth.x_max], atol=1e-3
        )
    masks = {c: out["detection_masks"].numpy()[0, row] > 0.5 for row, c in enumerate(classes)}
    assert masks[4].all()  # the bar fills its box
    assert not masks[3][16, 16] and masks[3][16, 2]  # the ring: a hole, a rim
    assert not masks[2][2, 30] and masks[2][30, 2]  # the L: no top-right corner
    assert not masks[1][0, 0] and masks[1][16, 16]  # the disc: round


@pytest.mark.parametrize("picture", ["letterboxed shapes", "square shapes", "nothing"])
def test_pose_head_is_the_stick_figures_numpy_computes(pose: Function, picture: str) -> None:
    canvas = np.full((640, 640, 3), 114, np.uint8)  # YOLO's letterbox grey
    if picture == "letterboxed shapes":
        canvas[80:560] = scenes.shapes_scene().pixels
    elif picture == "square shapes":
        canvas[:] = scenes.shapes_scene(640, 640).pixels
    images = tf.constant(canvas[None].astype(np.float32) / np.float32(255))
    got = pose(images=images)["output_0"].numpy()
    assert got.shape == (1, 56, 100)
    np.testing.assert_allclose(got[0], referencemodels.pose(canvas), atol=1e-3)
    assert (got[0, 4] > 0).sum() == (0 if picture == "nothing" else 4)


def test_pose_refuses_another_input_size(pose: Function) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError):
        pose(images=tf.zeros([1, 320, 320, 3]))


def test_embedder_is_a_thumbnail(model_repo: Path) -> None:
    embed = load(model_repo, "embedder")
    rng = np.random.default_rng(5)
    images = rng.random((3, 224, 224, 3), dtype=np.float32)
    images[2] = scenes.resize(scenes.shapes_scene().pixels, 224, 224) / np.float32(255)
    got = embed(inputs=tf.constant(images))["output_0"].numpy()
    assert got.shape == (3, 48)
    # float32 sums of 3136 pixels against float64 means.
    np.testing.assert_allclose(got, referencemodels.embedder(images), atol=2e-5)
    # The shapes' picture: its red disc is top left, its yellow bar bottom right.
    red_cell, yellow_cell = got[2].reshape(4, 4, 3)[0, 1], got[2].reshape(4, 4, 3)[3, 2]
    assert red_cell[0] > red_cell[2] and yellow_cell[1] > yellow_cell[2]
