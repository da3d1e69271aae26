"""Output plans of keypoint models: what the signature settles, what needs the model config
(refusals name the key to set)."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError, Kind
from gateway.tasks.detection.config import DetectionConfig, DetectionOutputs
from gateway.tasks.keypoints import TASK
from gateway.tasks.keypoints.config import KeypointConfig
from gateway.tasks.keypoints.names import COCO17_NAMES, COCO17_SKELETON
from gateway.upstream.signatures import TensorSpec
from tests.tasks.keypoints.support import F, model, signature

YOLO = KeypointConfig(DetectionConfig(outputs=DetectionOutputs(decoder="yolo-pose")))
OD = {
    "detection_boxes": TensorSpec(F, (1, 100, 4)),
    "detection_scores": TensorSpec(F, (1, 100)),
    "detection_classes": TensorSpec(F, (1, 100)),
    "num_detections": TensorSpec(F, (1,)),
    "detection_keypoints": TensorSpec(F, (1, 100, 17, 2)),
    "detection_keypoint_scores": TensorSpec(F, (1, 100, 17)),
}


def refusal(outputs: dict[str, TensorSpec], config: KeypointConfig | None) -> str:
    with pytest.raises(GatewayError) as info:
        TASK.output_plan(signature(outputs), model(config))
    assert info.value.kind is Kind.BAD_MODEL
    return info.value.message


def test_a_yolov8_pose_head_is_one_class_and_coco17() -> None:
    plan = TASK.output_plan(signature({"output0": TensorSpec(F, (1, 56, 2100))}), model(YOLO))
    assert plan.form == "yolo-pose" and plan.output_filter == ("output0",)
    assert (plan.points, plan.classes) == (17, 1)
    assert plan.names == COCO17_NAMES and plan.skeleton == COCO17_SKELETON
    assert plan.describe()["form"].startswith("yolo-pose raw head")


def test_named_keypoints_leave_the_rest_to_the_classes() -> None:
    config = KeypointConfig(YOLO.detection, names=("a", "b", "c", "d"))
    plan = TASK.output_plan(signature({"out": TensorSpec(F, (1, 4 + 2 + 12, -1))}), model(config))
    assert (plan.points, plan.classes, plan.names, plan.skeleton) == (4, 2, config.names, ())


def test_predictions_names_the_head_among_several_outputs() -> None:
    outputs = {"a": TensorSpec(F, (1, 56, -1)), "b": TensorSpec(F, (1, 56, -1))}
    assert "name the raw head" in refusal(outputs, YOLO)
    config = KeypointConfig(YOLO.detection, predictions="b")
    assert TASK.output_plan(signature(outputs), model(config)).head == "b"
    missing = KeypointConfig(YOLO.detection, predictions="c")
    assert "outputs.predictions = 'c' but model 'm' version 3 has no such" in refusal(
        outputs, missing
    )


def test_heads_that_cannot_be_read_are_refused_naming_the_key() -> None:
    assert "set outputs.keypoint_names to its 5 names" in refusal(
        {"o": TensorSpec(F, (1, 20, -1))}, YOLO
    )
    assert "not 4 box values, one class score and 3 per keypoint" in refusal(
        {"o": TensorSpec(F, (1, 21, -1))}, YOLO
    )
    assert "a YOLO-pose head is float [batch" in refusal({"o": TensorSpec(F, (1, 56))}, YOLO)
    three = KeypointConfig(YOLO.detection, names=("a", "b", "c"))
    assert "cannot hold 4 box values, a class score and 3 keypoints" in refusal(
        {"o": TensorSpec(F, (1, 12, -1))}, three
    )


def test_od_api_keypoints_need_no_config() -> None:
    plan = TASK.output_plan(signature(OD), model())
    assert plan.form == "od_keypoints" and plan.points == 17
    assert plan.output_filter == (
        "detection_boxes", "detection_scores", "detection_classes", "num_detections",
        "detection_keypoints", "detection_keypoint_scores",
    )  # fmt: skip
    assert plan.names == COCO17_NAMES
    assert plan.describe()["keypoints"].startswith("detection_keypoints (normalized y, x)")


def test_od_keypoints_under_other_names_and_counts() -> None:
    outputs = {**OD, "kp": TensorSpec(F, (1, 100, 3, 2)), "ks": TensorSpec(F, (1, 100, 3))}
    config = KeypointConfig(keypoints="kp", keypoint_scores="ks", names=("x", "y", "z"))
    plan = TASK.output_plan(signature(outputs), model(config))
    assert (plan.keypoints, plan.keypoint_scores, plan.points) == ("kp", "ks", 3)
    assert "outputs.keypoint_names lists 2" in refusal(
        outputs, KeypointConfig(keypoints="kp", keypoint_scores="ks", names=("x", "y"))
    )
    assert "set outputs.keypoint_names to its 3 names" in refusal(
        outputs, KeypointConfig(keypoints="kp", keypoint_scores="ks")
    )


def test_signatures_without_keypoints_say_what_to_set() -> None:
    detector = {k: v for k, v in OD.items() if "keypoint" not in k}
    message = refusal(detector, None)
    assert "has no 'detection_keypoints' output for keypoints" in message
    assert "outputs.keypoints" in message and "outputs.decoder = 'yolo-pose'" in message
    assert "set outputs.decoder = 'yolo-pose'" in refusal(
        {"output0": TensorSpec(F, (1, 56, 8400))}, None
    )
    assert "outputs.keypoints = 'kp' but" in refusal(detector, KeypointConfig(keypoints="kp"))
    bad = {**OD, "detection_keypoints": TensorSpec(F, (1, 100, 17, 3))}
    assert "keypoints must be [batch, N, K, 2]" in refusal(bad, None)
