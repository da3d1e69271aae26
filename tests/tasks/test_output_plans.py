"""Output plans: what the gateway recognises in a signature by itself, what it needs the
model config for (refusals name the key), and how each plan maps outputs to results."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.config import Settings
from gateway.domain import Frame
from gateway.errors import GatewayError, Kind
from gateway.labels import Labels
from gateway.models import ModelConfig
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.classification import ClassificationTask
from gateway.tasks.classification.config import ClassificationConfig, ClassificationOutputs
from gateway.tasks.classification.nouns import ClassifyOptions
from gateway.tasks.detection import DetectionTask
from gateway.tasks.detection.config import DetectionConfig, DetectionOutputs
from gateway.tasks.detection.nouns import DetectOptions
from gateway.upstream.signatures import Signature, TensorSpec

F = tfs.DT_FLOAT
OD_API = {
    "detection_boxes": TensorSpec(F, (1, 100, 4)),
    "detection_scores": TensorSpec(F, (1, 100)),
    "detection_classes": TensorSpec(F, (1, 100)),
    "num_detections": TensorSpec(F, (1,)),
    "raw_detection_boxes": TensorSpec(F, (1, -1, 4)),
}
MODEL_GARDEN = {
    "detection_boxes": TensorSpec(F, (1, 50, 4)),
    "detection_scores": TensorSpec(F, (1, 50)),
    "detection_classes": TensorSpec(tfs.DT_INT32, (1, 50)),
    "num_detections": TensorSpec(tfs.DT_INT32, (1,)),
    "image_info": TensorSpec(F, (1, 4, 2)),
}
DETECT = DetectionTask()
CLASSIFY = ClassificationTask()
DETECTION, CLASSIFICATION = DETECT.name, CLASSIFY.name


def signature(outputs: dict[str, TensorSpec]) -> Signature:
    return Signature("m", 3, {"inputs": TensorSpec(tfs.DT_UINT8, (1, -1, -1, 3))}, outputs)


def detector(**outputs: object) -> ModelConfig:
    mapping = DetectionOutputs(**outputs, declared=frozenset(outputs))  # type: ignore[arg-type]
    return ModelConfig("m", DETECTION, task_config=DetectionConfig(outputs=mapping))


def refusal(task: object, outputs: dict[str, TensorSpec], config: ModelConfig) -> str:
    with pytest.raises(GatewayError) as info:
        task.output_plan(signature(outputs), config)  # type: ignore[attr-defined]
    assert info.value.kind is Kind.BAD_MODEL
    return info.value.message


def test_od_api_outputs_need_no_config_and_take_the_fast_path() -> None:
    plan = DETECT.output_plan(signature(OD_API), detector())
    assert plan.form == "od_api"
    assert plan.output_filter == (
        "detection_boxes", "detection_scores", "detection_classes", "num_detections"
    )  # fmt: skip
    assert plan.describe()["form"] == "TF Object Detection API"


def test_model_garden_outputs_are_refused_until_the_coordinates_are_declared() -> None:
    message = refusal(DETECT, MODEL_GARDEN, detector())
    assert "outputs.box_coordinates = 'image_info'" in message
    assert "output_normalized_coordinates" in message
    plan = DETECT.output_plan(signature(MODEL_GARDEN), detector(box_coordinates="image_info"))
    assert (plan.form, plan.image_info, plan.describe()["form"]) == (
        "boxes", "image_info", "TF Model Garden"
    )  # fmt: skip
    assert "image_info" in plan.output_filter
    normalized = DETECT.output_plan(signature(MODEL_GARDEN), detector(box_coordinates="normalized"))
    assert normalized.form == "od_api" and "image_info" not in normalized.output_filter


def test_anchor_based_raw_heads_are_refused_with_the_export_to_use() -> None:
    raw = {"bbox_regression": TensorSpec(F, (-1, -1, 4)), "cls_logits": TensorSpec(F, (-1, -1, 6))}
    message = refusal(DETECT, raw, detector())
    assert "anchor-based raw head (bbox_regression, cls_logits" in message
    assert "cannot decode" in message and "NMS in the graph" in message


def test_a_single_three_dimensional_output_suggests_the_yolo_decoder() -> None:
    head = {"output_0": TensorSpec(F, (-1, 84, 8400))}
    assert "outputs.decoder = 'yolo'" in refusal(DETECT, head, detector())
    plan = DETECT.output_plan(signature(head), detector(decoder="yolo"))
    assert (plan.form, plan.head, plan.nms_iou) == ("yolo", "output_0", 0.45)
    assert "several" not in refusal(
        DETECT, {"output_0": TensorSpec(F, (-1, 84))}, detector(decoder="yolo")
    )


def test_declared_names_that_the_signature_lacks_are_named() -> None:
    message = refusal(DETECT, OD_API, detector(boxes="boxes"))
    assert "outputs.boxes = 'boxes' but model 'm' version 3 has no such output" in message


def test_declared_pixel_xyxy_boxes_with_a_class_offset_map_to_pixels() -> None:
    outputs = {
        "boxes": TensorSpec(F, (1, -1, 4)),
        "scores": TensorSpec(F, (1, -1)),
        "labels": TensorSpec(tfs.DT_INT64, (1, -1)),
    }
    config = detector(
        boxes="boxes", scores="scores", classes="labels", box_format="xyxy",
        box_coordinates="pixels", class_offset=1,
    )  # fmt: skip
    plan = DETECT.output_plan(signature(outputs), config)
    assert plan.form == "boxes" and plan.num_detections is None
    result = DETECT.map(
        {
            "boxes": np.array([[[32, 10, 96, 50], [0, 0, 5, 5]]], np.float32),
            "scores": np.array([[0.9, 0.1]], np.float32),
            "labels": np.array([[2, 0]], np.int64),
        },
        plan,
        Frame(320, 240, None, (160, 120)),  # the model got the image at half size
        DETECT.resolve(DetectOptions(min_score=0.5), config, config.rules(Settings())),
        config,
    )
    [found] = result.detections
    assert (found.class_id, found.box) == (3, (64, 20, 192, 100))


def test_classification_reads_a_single_output_as_probabilities_and_declared_logits() -> None:
    single = {"output_0": TensorSpec(F, (-1, 3))}
    plain = ModelConfig("m", CLASSIFICATION, Labels.parse_lines("a\nb\nc\n"))
    plan = CLASSIFY.output_plan(signature(single), plain)
    assert (plan.form, plan.output_filter) == ("probabilities", ("output_0",))
    sigmoid = ModelConfig(
        "m",
        CLASSIFICATION,
        task_config=ClassificationConfig(
            outputs=ClassificationOutputs(logits="output_0", logits_activation="sigmoid")
        ),
    )
    plan = CLASSIFY.output_plan(signature(single), sigmoid)
    result = CLASSIFY.map(
        {"output_0": np.array([[2.0, 0.0, -2.0]], np.float32)},
        plan,
        Frame(8, 8),
        CLASSIFY.resolve(ClassifyOptions(top_k=3), sigmoid, sigmoid.rules(Settings())),
        sigmoid,
    )
    assert [round(c.score, 4) for c in result.classes] == [0.8808, 0.5, 0.1192]


def test_model_gardens_probs_output_is_recognised() -> None:
    outputs = {"probs": TensorSpec(F, (1, 10)), "logits": TensorSpec(F, (1, 10))}
    plan = CLASSIFY.output_plan(signature(outputs), ModelConfig("m", CLASSIFICATION))
    assert (plan.form, plan.output_filter) == ("probabilities", ("probs",))
