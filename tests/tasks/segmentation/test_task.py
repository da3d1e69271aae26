"""The instance segmentation task: its model-config keys (detection's plus masks and
mask_threshold, unknown ones refused by name), its plans (BAD_MODEL naming the key to set),
its options' checks, and outputs -> instances whose masks follow their rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.config import Settings
from gateway.domain import Frame, OutputError
from gateway.errors import GatewayError, Kind
from gateway.labels import Labels
from gateway.models import ModelConfig
from gateway.models.values import ModelConfigError
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.segmentation import TASK, mapping
from gateway.tasks.segmentation.config import SegmentationConfig
from gateway.tasks.segmentation.nouns import SegmentOptions, Segments
from gateway.tasks.segmentation.plans import SegmentationPlan
from gateway.upstream.signatures import Signature, TensorSpec
from tests.support import masks

PATH = Path("models.toml")
F = tfs.DT_FLOAT
OD = {
    "detection_boxes": TensorSpec(F, (1, -1, 4)),
    "detection_scores": TensorSpec(F, (1, -1)),
    "detection_classes": TensorSpec(F, (1, -1)),
    "num_detections": TensorSpec(F, (1,)),
}


def read(table: dict[str, Any]) -> SegmentationConfig:
    config: SegmentationConfig = TASK.read_config(
        {"task": "instance_segmentation", **table}, PATH, "models.seg"
    )
    return config


def signature(outputs: dict[str, TensorSpec]) -> Signature:
    return Signature("m", 3, {"images": TensorSpec(tfs.DT_UINT8, (1, -1, -1, 3))}, outputs)


def model(config: SegmentationConfig | None = None) -> ModelConfig:
    return ModelConfig("m", TASK.name, labels=Labels({1: "cat"}), task_config=config)


def test_config_defaults_and_keys() -> None:
    assert read({}) == SegmentationConfig()
    config = read({"min_score": 0.3, "outputs": {"masks": "m", "mask_threshold": 0.25,
                                                  "boxes": "b"}})  # fmt: skip
    assert (config.masks, config.mask_threshold, config.detection.min_score) == ("m", 0.25, 0.3)
    assert config.detection.outputs.boxes == "b"


@pytest.mark.parametrize(
    "table, message",
    [
        ({"top_k": 3}, "models.seg.top_k"),
        ({"outputs": {"keypoints": "k"}}, "models.seg.outputs.keypoints"),
        ({"outputs": {"masks": ""}}, "outputs.masks must name an output"),
        ({"outputs": {"mask_threshold": 1.0}}, "mask_threshold must be a number above 0"),
        ({"outputs": {"mask_threshold": 0}}, "mask_threshold must be a number above 0"),
        ({"outputs": {"mask_threshold": True}}, "mask_threshold must be a number above 0"),
        ({"outputs": {"decoder": "yolo"}}, "models.seg.outputs.decoder"),
    ],
)
def test_bad_keys_are_refused_by_name(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigError, match=r"models\.toml: ") as info:
        read(table)
    assert message in str(info.value)


def test_plans_name_what_to_set() -> None:
    plan = TASK.output_plan(signature({**OD, "detection_masks": TensorSpec(F, (1, -1, 28, 28))}),
                            model())  # fmt: skip
    assert isinstance(plan, SegmentationPlan) and plan.masks == "detection_masks"
    assert set(plan.output_filter) == {*OD, "detection_masks"}
    assert plan.describe()["masks"].startswith("detection_masks (box-relative")
    renamed = TASK.output_plan(signature({**OD, "masks": TensorSpec(F, None)}),
                               model(read({"outputs": {"masks": "masks"}})))  # fmt: skip
    assert isinstance(renamed, SegmentationPlan) and renamed.masks == "masks"
    for outputs, config, message in (
        (OD, None, "name its box-relative mask output"),
        (OD, read({"outputs": {"masks": "m"}}), "outputs.masks = 'm' but"),
        ({**OD, "detection_masks": TensorSpec(F, (1, -1, 28))}, None, "masks must be float"),
        ({**OD, "detection_masks": TensorSpec(tfs.DT_STRING, None)}, None, "masks must be float"),
    ):
        with pytest.raises(GatewayError) as info:
            TASK.output_plan(signature(outputs), model(config))
        assert info.value.kind is Kind.BAD_MODEL and message in str(info.value), str(info.value)


def test_options_are_checked_and_completed() -> None:
    config = model(read({"outputs": {"mask_threshold": 0.3}}))
    rules = config.rules(Settings())
    resolved = TASK.resolve(SegmentOptions(), config, rules)
    assert resolved.mask_threshold == 0.3 and resolved.mask_format == "rle"
    assert TASK.resolve(SegmentOptions(mask_threshold=0.7, mask_format="PNG"), config,
                        rules)[2:4] == (0.7, "png")  # fmt: skip
    for options, message in (
        (SegmentOptions(mask_threshold=1.0), "mask_threshold must be in [0, 1)"),
        (SegmentOptions(mask_threshold=float("nan")), "mask_threshold must be in [0, 1)"),
        (SegmentOptions(mask_format="svg"), "mask_format must be one of rle, polygon, png"),
        (SegmentOptions(min_score=-1), "min_score must be in [0, 1]"),
    ):
        with pytest.raises(GatewayError) as info:
            TASK.resolve(options, config, rules)
        assert info.value.kind is Kind.INVALID_INPUT and message in str(info.value)


def outputs(grids: np.ndarray, scores: list[float]) -> dict[str, np.ndarray]:
    n = len(scores)
    boxes = np.array([[0.1, 0.1, 0.5, 0.5], [0.5, 0.5, 0.9, 0.9], [0, 0, 1, 1]][:n], np.float32)
    return {
        "detection_boxes": boxes[None],
        "detection_scores": np.array([scores], np.float32),
        "detection_classes": np.ones((1, n), np.float32),
        "num_detections": np.array([n], np.float32),
        "detection_masks": grids[None].astype(np.float32),
    }


def run(found: dict[str, np.ndarray], options: SegmentOptions | None = None) -> Segments:
    config = model()
    plan = TASK.output_plan(signature({**OD, "detection_masks": TensorSpec(F, None)}), config)
    resolved = TASK.resolve(options or SegmentOptions(), config, config.rules(Settings()))
    result: Segments = TASK.map(found, plan, Frame(100, 50), resolved, config)
    return result


def test_each_instance_gets_the_mask_of_its_row_best_first() -> None:
    grids = np.zeros((2, 4, 4))
    grids[0, :, :2] = 1.0  # the first row's left half
    grids[1] = 1.0
    result = run(outputs(grids, [0.6, 0.9]))
    assert [i.score for i in result.instances] == pytest.approx([0.9, 0.6])
    best, second = (masks.rle_decode([i.mask.height, i.mask.width], i.mask.counts or "")
                    for i in result.instances)  # fmt: skip
    assert best.shape == (50, 100) and best[28:42, 55:85].all() and best.sum() <= 800
    assert second[8:22, 12:28].all() and not second[:, 30:].any() and not second[:5].any()
    assert result.instances[0].label == "cat"
    assert TASK.summary(result) == {"instances": 2}


def test_bad_masks_are_output_errors() -> None:
    for grids, message in (
        (np.full((1, 4, 4), 1.5), "outside [0, 1]"),
        (np.full((1, 4, 4), np.nan), "NaN"),
    ):
        with pytest.raises(OutputError, match=message.replace("[", r"\[")):
            run(outputs(grids, [0.9]))
    short = outputs(np.ones((1, 4, 4)), [0.9, 0.8])
    short["detection_masks"] = short["detection_masks"][:, :1]
    with pytest.raises(OutputError, match="has 1 rows"):
        run(short)
    flat = outputs(np.ones((1, 4, 4)), [0.9])
    flat["detection_masks"] = flat["detection_masks"][0]
    with pytest.raises(OutputError, match="expected float"):
        run(flat)


def test_polygons_past_the_limit_ask_for_another_format(monkeypatch: pytest.MonkeyPatch) -> None:
    found = outputs(np.ones((1, 4, 4)), [0.9])
    assert run(found, SegmentOptions(mask_format="polygon")).instances[0].mask.polygons
    monkeypatch.setattr(mapping, "MAX_POLYGON_POINTS", 10)
    with pytest.raises(GatewayError, match="ask for mask_format rle or png") as info:
        run(found, SegmentOptions(mask_format="polygon"))
    assert info.value.kind is Kind.INVALID_INPUT
