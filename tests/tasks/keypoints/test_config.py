"""The keypoints task's model-config keys: detection's plus its own, unknown ones refused by
name, names and skeletons checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.models.values import ModelConfigError
from gateway.tasks.keypoints import TASK
from gateway.tasks.keypoints.config import KeypointConfig, names_and_skeleton
from gateway.tasks.keypoints.names import COCO17_NAMES, COCO17_SKELETON

PATH = Path("models.toml")


def read(table: dict[str, Any]) -> KeypointConfig:
    return TASK.read_config({"task": "keypoints", **table}, PATH, "models.pose")


def refused(table: dict[str, Any]) -> str:
    with pytest.raises(ModelConfigError) as info:
        read(table)
    return str(info.value)


def test_a_yolo_pose_head_with_its_keys() -> None:
    config = read(
        {
            "min_score": 0.3,
            "outputs": {"decoder": "yolo-pose", "predictions": "output0", "nms_iou": 0.6,
                        "max_candidates": 50},
        }
    )  # fmt: skip
    assert config.decoder == "yolo-pose" and config.predictions == "output0"
    assert config.detection.min_score == 0.3
    assert config.detection.outputs.nms_iou == 0.6
    assert config.detection.outputs.max_candidates == 50
    assert config.names is None and config.skeleton is None


def test_od_style_outputs_and_names_with_a_skeleton_of_names_and_indices() -> None:
    config = read(
        {
            "outputs": {
                "keypoints": "kp",
                "keypoint_scores": "kp_scores",
                "boxes": "b",
                "keypoint_names": ["head", "tail", "fin"],
                "skeleton": [["head", "fin"], [1, 2]],
            }
        }
    )
    assert (config.keypoints, config.keypoint_scores) == ("kp", "kp_scores")
    assert config.detection.outputs.boxes == "b"
    assert config.names == ("head", "tail", "fin")
    assert config.skeleton == ((0, 2), (1, 2))


def test_coco17_by_name_gives_cocos_names_and_skeleton() -> None:
    config = read({"outputs": {"keypoint_names": "coco17"}})
    assert names_and_skeleton(config.names, config.skeleton, 17) == (
        COCO17_NAMES,
        COCO17_SKELETON,
    )
    assert COCO17_NAMES[:3] == ("nose", "left_eye", "right_eye")
    assert len(COCO17_SKELETON) == 19 and (15, 13) in COCO17_SKELETON  # left ankle-knee


def test_no_names_means_coco17_for_17_points_only() -> None:
    config = read({})
    assert names_and_skeleton(config.names, config.skeleton, 17) == (
        COCO17_NAMES,
        COCO17_SKELETON,
    )
    assert names_and_skeleton(config.names, config.skeleton, 5) is None
    own = read({"outputs": {"keypoint_names": ["a", "b"]}})
    assert names_and_skeleton(own.names, own.skeleton, 2) == (("a", "b"), ())


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"top_k": 3}, "unknown key 'models.pose.top_k'"),
        ({"outputs": {"masks": "m"}}, "unknown key 'models.pose.outputs.masks'"),
        ({"outputs": {"decoder": "yolo"}}, "decoder must be one of"),
        ({"outputs": {"predictions": "p"}}, "set that decoder, or remove predictions"),
        (
            {"outputs": {"decoder": "yolo-pose", "keypoints": "k"}},
            "reads the keypoints from the head itself; remove keypoints",
        ),
        ({"outputs": {"keypoints": ""}}, "outputs.keypoints must name an output"),
        ({"outputs": {"keypoint_names": "coco"}}, 'must be "coco17" or a list'),
        ({"outputs": {"keypoint_names": ["a", "a"]}}, "'a' repeats"),
        ({"outputs": {"keypoint_names": ["a", 1]}}, 'must be "coco17" or a list'),
        ({"outputs": {"skeleton": [["nose"]]}}, "is not a pair"),
        ({"outputs": {"skeleton": [["nose", "tail"]]}}, "'tail' is not one of the keypoint"),
        ({"outputs": {"skeleton": [[0, 17]]}}, "17 is neither a keypoint name nor an index"),
        ({"outputs": {"skeleton": [[3, 3]]}}, "joins a keypoint to itself"),
        ({"outputs": {"skeleton": "coco"}}, "must be a list of pairs"),
    ],
)
def test_bad_keys_are_refused_by_name(table: dict[str, Any], message: str) -> None:
    error = refused(table)
    assert error.startswith("models.toml: ")
    assert message in error
