"""Keypoint outputs -> instances with named keypoints in pixels of the image as a viewer
shows it: YOLO-pose heads (NMS, keypoints of the kept candidates) and OD API-style outputs
(keypoints of the kept rows), through resizing, EXIF orientation and letterboxing."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from gateway.config import Settings
from gateway.core.letterbox import unletterbox
from gateway.domain import Frame, OutputError
from gateway.imaging.orientation import orient_box
from gateway.labels import Labels
from gateway.models import ModelConfig
from gateway.tasks.decoders import pose
from gateway.tasks.detection.config import DetectionConfig, DetectionOutputs
from gateway.tasks.detection.nouns import Box, DetectOptions
from gateway.tasks.keypoints import TASK
from gateway.tasks.keypoints.config import KeypointConfig
from gateway.tasks.keypoints.names import COCO17_SKELETON
from gateway.tasks.keypoints.nouns import Keypoints
from gateway.upstream.signatures import TensorSpec
from tests.tasks.keypoints.support import F, signature, yolo_pose_head

NAMES = ("head", "left", "right")
YOLO = KeypointConfig(
    DetectionConfig(outputs=DetectionOutputs(decoder="yolo-pose")), names=NAMES,
    skeleton=((0, 1), (0, 2)),
)  # fmt: skip
CONFIG = ModelConfig("m", TASK.name, labels=Labels({0: "person"}), task_config=YOLO)
POINTS = [(100.0, 60.0, 0.9), (80.0, 120.0, 0.2), (120.0, 121.0, 0.7)]
HEAD = yolo_pose_head(
    [
        (100, 100, 80, 120, [0.9, 0.1], POINTS),
        (102, 101, 80, 120, [0.8, 0.1], [(1.0, 1.0, 1.0)] * 3),  # suppressed by the first
        (250, 250, 40, 40, [0.1, 0.6], [(250.0, 240.0, 0.5)] * 3),  # another class
        (30, 30, 20, 20, [0.2, 0.1], [(30.0, 30.0, 0.5)] * 3),  # under min_score
    ]
)
SETTINGS = Settings()
DEFAULT_OPTIONS = DetectOptions(min_score=0.25)


def run(
    outputs: dict[str, np.ndarray],
    frame: Frame,
    config: ModelConfig = CONFIG,
    options: DetectOptions = DEFAULT_OPTIONS,
    specs: dict[str, TensorSpec] | None = None,
) -> Keypoints:
    specs = specs or {k: TensorSpec(F, tuple(v.shape)) for k, v in outputs.items()}
    plan = TASK.output_plan(signature(specs), config)
    resolved = TASK.resolve(options, config, config.rules(SETTINGS))
    return TASK.map(outputs, plan, frame, resolved, config)


def points(result: Keypoints, i: int = 0) -> list[tuple[str, float, float, float]]:
    return [(p.name, round(p.x, 3), round(p.y, 3), round(p.score, 3))
            for p in result.instances[i].keypoints]  # fmt: skip


def test_yolo_pose_keypoints_of_the_kept_candidates_in_the_caller_pixels() -> None:
    # The model saw 320x320; the caller's image is 640x480 (stretched).
    result = run({"output0": HEAD}, Frame(640, 480, None, (320, 320)))
    assert [(i.class_id, i.label, round(i.score, 3)) for i in result.instances] == [
        (0, "person", 0.9),
        (1, "class_1", 0.6),
    ]
    assert result.instances[0].box == Box(120, 60, 280, 240)
    assert points(result) == [
        ("head", 200.0, 90.0, 0.9), ("left", 160.0, 180.0, 0.2), ("right", 240.0, 181.5, 0.7),
    ]  # fmt: skip
    assert result.skeleton == ((0, 1), (0, 2))
    assert TASK.summary(result) == {"instances": 2}


def test_options_pick_the_instances() -> None:
    result = run({"o": HEAD}, Frame(320, 320, None, (320, 320)), options=DetectOptions(0.1, 1))
    assert len(result.instances) == 1 and points(result)[0] == ("head", 100.0, 60.0, 0.9)
    everything = run({"o": HEAD}, Frame(320, 320, None, (320, 320)), options=DetectOptions(0.15))
    assert len(everything.instances) == 3


def test_exif_orientation_and_letterboxing_map_points_as_boxes() -> None:
    # Stored 320x320, shown rotated 90° clockwise: (x, y) -> (H - y, x).
    rotated = run({"o": HEAD}, Frame(320, 320, partial(orient_box, orientation=6), (320, 320)))
    assert points(rotated)[0] == ("head", 260.0, 100.0, 0.9)
    assert rotated.instances[0].box == Box(160, 60, 280, 140)
    # A 640x320 image letterboxed into 320x320: content 320x160 at the top left.
    boxed = Frame(640, 320, partial(unletterbox, y_scale=2.0, x_scale=1.0), (320, 320))
    assert points(run({"o": HEAD}, boxed))[0] == ("head", 200.0, 120.0, 0.9)


def test_points_outside_the_image_are_clamped() -> None:
    head = yolo_pose_head([(10, 10, 20, 20, [0.9], [(-5.0, 330.0, 1.0)] * 3)])
    result = run({"o": head}, Frame(320, 320, None, (320, 320)))
    assert points(result)[0] == ("head", 0.0, 320.0, 1.0)


def test_a_coco17_head_gets_cocos_names_and_skeleton() -> None:
    config = ModelConfig("m", TASK.name, task_config=KeypointConfig(YOLO.detection))
    head = yolo_pose_head([(50, 50, 10, 10, [0.8], [(float(k), 2.0 * k, 0.5) for k in range(17)])])
    result = run({"o": head}, Frame(320, 320, None, (320, 320)), config)
    assert [p.name for p in result.instances[0].keypoints][:2] == ["nose", "left_eye"]
    assert points(result)[16] == ("right_ankle", 16.0, 32.0, 0.5)
    assert result.skeleton == COCO17_SKELETON


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (yolo_pose_head([(10, 10, 5, 5, [0.9], [(np.nan, 1.0, 1.0)] * 3)]), "NaN or infinite"),
        (yolo_pose_head([(10, 10, 5, 5, [0.9], [(1.0, 1.0, 1.5)] * 3)]), "must be numbers in"),
        (yolo_pose_head([(10, 10, 5, 5, [], [(1.0, 1.0, 1.0)] * 3)]), "cannot hold 4 box"),
        (np.zeros((1, 20)), "expected [1, 4 + classes + 3 x keypoints, candidates]"),
    ],
)
def test_unusable_heads_are_output_errors(head: np.ndarray, message: str) -> None:
    spec = {"o": TensorSpec(F, (1, -1, -1))}
    with pytest.raises(OutputError) as info:
        run({"o": head}, Frame(320, 320, None, (320, 320)), specs=spec)
    assert message in str(info.value)


def od_outputs(keypoints: np.ndarray | None = None) -> dict[str, np.ndarray]:
    rows = 4
    boxes = np.zeros((1, rows, 4), np.float32)
    boxes[0, 0] = [0.1, 0.2, 0.5, 0.6]
    boxes[0, 1] = [0.5, 0.5, 0.9, 0.9]
    boxes[0, 2] = [0.0, 0.0, 0.1, 0.1]
    kp = np.zeros((1, rows, 3, 2), np.float32)
    kp[0, 0] = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]
    kp[0, 1] = [[0.6, 0.6], [0.7, 0.7], [0.8, 0.8]]
    kp[0, 2] = [[0.05, 0.05]] * 3
    kp[0, 3] = [[9.0, 9.0]] * 3  # padding after num_detections: never read
    return {
        "detection_boxes": boxes,
        "detection_scores": np.array([[0.5, 0.8, 0.1, 0.0]], np.float32),
        "detection_classes": np.array([[1, 1, 1, 0]], np.float32),
        "num_detections": np.array([3], np.float32),
        "detection_keypoints": kp if keypoints is None else keypoints,
        "detection_keypoint_scores": np.array([[[0.9, 0.8, 0.7], [0.1, 0.2, 0.3],
                                                [0.5] * 3, [0.0] * 3]], np.float32),
    }  # fmt: skip


OD_CONFIG = ModelConfig(
    "m", TASK.name, labels=Labels({1: "person"}), task_config=KeypointConfig(names=NAMES)
)


def test_od_keypoints_follow_their_detections_rows() -> None:
    result = run(od_outputs(), Frame(200, 100, None, (200, 100)), OD_CONFIG)
    assert [(i.label, round(i.score, 3)) for i in result.instances] == [
        ("person", 0.8), ("person", 0.5),
    ]  # fmt: skip
    assert result.instances[1].box == Box(40, 10, 120, 50)
    assert points(result, 0) == [
        ("head", 120.0, 60.0, 0.1), ("left", 140.0, 70.0, 0.2), ("right", 160.0, 80.0, 0.3),
    ]  # fmt: skip
    assert points(result, 1)[0] == ("head", 40.0, 10.0, 0.9)
    assert result.skeleton == ()


def test_od_keypoints_through_exif_orientation() -> None:
    frame = Frame(100, 200, partial(orient_box, orientation=6), (200, 100))
    result = run(od_outputs(), frame, OD_CONFIG)
    # Stored (y, x) = (0.1, 0.2) of a 200x100 image, shown rotated: x' = 1 - y, y' = x.
    assert points(result, 1)[0] == ("head", 90.0, 40.0, 0.9)


def test_od_keypoints_that_are_not_normalized_or_misshapen_are_refused() -> None:
    pixels = od_outputs()["detection_keypoints"] * 100
    with pytest.raises(OutputError, match=r"detection_keypoints\[1\] holds values outside"):
        run(od_outputs(pixels), Frame(200, 100, None, (200, 100)), OD_CONFIG)
    short = od_outputs()
    short["detection_keypoint_scores"] = short["detection_keypoint_scores"][:, :, :2]
    specs = {k: TensorSpec(F, tuple(v.shape)) for k, v in od_outputs().items()}
    with pytest.raises(OutputError, match="does not match detection_keypoints"):
        run(short, Frame(200, 100, None, (200, 100)), OD_CONFIG, specs=specs)


def test_the_pose_decoder_splits_a_head_and_picks_candidates() -> None:
    boxes, kp = pose.split_head(HEAD[0], 3)
    assert boxes.shape == (6, 4) and kp.shape == (3, 3, 4)
    xy, visibility = pose.keypoints_of(kp, np.array([2, 0]))
    assert xy.shape == (2, 3, 2) and xy[1].tolist() == [[100, 60], [80, 120], [120, 121]]
    assert visibility[1].round(3).tolist() == [0.9, 0.2, 0.7]
    with pytest.raises(ValueError, match="cannot hold"):
        pose.split_head(HEAD[0], 4)
