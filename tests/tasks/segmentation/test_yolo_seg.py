"""YOLOv8/11-seg raw heads (decoder = "yolo-seg"): its config keys, its plan (head and
prototypes recognised by rank or named), the prototypes' layout read from their shape, and
masks = sigmoid(coefficients . prototypes) upsampled and kept inside each kept box, through
NMS and EXIF orientation."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.config import Settings
from gateway.domain import Frame, OutputError
from gateway.errors import GatewayError, Kind
from gateway.imaging.orientation import orient_box
from gateway.models import ModelConfig
from gateway.models.values import ModelConfigError
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.decoders import yoloseg
from gateway.tasks.segmentation import TASK
from gateway.tasks.segmentation.config import SegmentationConfig
from gateway.tasks.segmentation.nouns import SegmentOptions, Segments
from gateway.tasks.segmentation.plans import SegmentationPlan
from gateway.upstream.signatures import Signature, TensorSpec
from tests.support import masks

F = tfs.DT_FLOAT
HEAD = TensorSpec(F, (1, 7, -1))  # 4 + 1 class + 2 coefficients
PROTOS = TensorSpec(F, (1, 2, 16, 16))


def read(table: dict[str, Any]) -> SegmentationConfig:
    config: SegmentationConfig = TASK.read_config(
        {"task": "instance_segmentation", **table}, Path("models.toml"), "models.seg"
    )
    return config


YOLO = read({"outputs": {"decoder": "yolo-seg", "nms_iou": 0.5}})


def signature(outputs: dict[str, TensorSpec]) -> Signature:
    return Signature("m", 3, {"images": TensorSpec(tfs.DT_UINT8, (1, 64, 64, 3))}, outputs)


def model(config: SegmentationConfig = YOLO) -> ModelConfig:
    return ModelConfig("m", TASK.name, task_config=config)


def test_config_keys_of_the_decoder() -> None:
    assert YOLO.decoder == "yolo-seg" and YOLO.detection.outputs.nms_iou == 0.5
    named = read({"outputs": {"decoder": "yolo-seg", "predictions": "p", "prototypes": "q"}})
    assert (named.predictions, named.prototypes) == ("p", "q")
    for table, message in (
        ({"outputs": {"prototypes": "q"}}, "set that decoder"),
        ({"outputs": {"decoder": "yolo-seg", "masks": "m"}}, "remove masks"),
        ({"outputs": {"decoder": "yolo-pose"}}, "outputs.decoder"),
    ):
        with pytest.raises(ModelConfigError) as info:
            read(table)
        assert message in str(info.value)


def test_plans_find_the_head_and_prototypes_by_rank_or_name() -> None:
    plan = TASK.output_plan(signature({"output0": HEAD, "output1": PROTOS}), model())
    assert isinstance(plan, SegmentationPlan) and plan.form == "yolo-seg"
    assert plan.detection is not None and plan.detection.head == "output0"
    assert plan.prototypes == "output1" and set(plan.output_filter) == {"output0", "output1"}
    assert plan.describe()["form"].startswith("yolo-seg raw head")
    two_heads = {"a": HEAD, "b": HEAD, "output1": PROTOS}
    with pytest.raises(GatewayError, match=r"with outputs\.predictions") as info:
        TASK.output_plan(signature(two_heads), model())
    assert info.value.kind is Kind.BAD_MODEL
    named = read({"outputs": {"decoder": "yolo-seg", "predictions": "b"}})
    chosen = TASK.output_plan(signature(two_heads), model(named))
    assert isinstance(chosen, SegmentationPlan) and chosen.detection is not None
    assert chosen.detection.head == "b"
    wrong = read({"outputs": {"decoder": "yolo-seg", "prototypes": "a"}})
    with pytest.raises(GatewayError, match="float prototypes"):
        TASK.output_plan(signature({"a": HEAD, "output1": PROTOS}), model(wrong))


def test_the_layout_is_read_from_the_shape() -> None:
    assert yoloseg.prototype_layout((1, 32, 160, 160), (640, 640)) == yoloseg.NCHW
    assert yoloseg.prototype_layout((1, 160, 160, 32), (640, 640)) == yoloseg.NHWC
    assert yoloseg.prototype_layout((1, 32, 120, 160), (640, 480)) == yoloseg.NCHW
    assert yoloseg.prototype_layout((1, 120, 160, 32), (640, 480)) == yoloseg.NHWC
    assert yoloseg.prototype_layout((1, 32, 32, 32), (128, 128)) == yoloseg.NCHW
    with pytest.raises(ValueError, match="aspect"):
        yoloseg.prototype_layout((1, 32, 100, 20), (640, 480))


def outputs(layout: str = "NCHW") -> dict[str, np.ndarray]:
    # 64x64 image sent, 16x16 prototypes: map 0 is +8 on the left half, -8 on the right; map
    # 1 is +8 on the top half. Candidate 0 (the whole image, coefficients [1, 0]) is the left
    # half; candidate 1 (x 32..64, y 0..64; [0, 1]) the top of its box; candidate 2 overlaps
    # candidate 0 and is suppressed; candidate 3 scores under min_score.
    protos = np.full((2, 16, 16), -8.0, np.float32)
    protos[0, :, :8] = 8.0
    protos[1, :8, :] = 8.0
    columns = [
        [32, 32, 64, 64, 0.9, 1, 0],
        [48, 32, 32, 64, 0.8, 0, 1],
        [33, 32, 64, 64, 0.7, 0, 1],
        [10, 10, 8, 8, 0.1, 1, 0],
    ]
    head = np.asarray(columns, np.float32).T[None]
    prototypes = protos[None] if layout == "NCHW" else protos.transpose(1, 2, 0)[None]
    return {"output0": head, "output1": prototypes}


def run(found: dict[str, np.ndarray], frame: Frame, **options: Any) -> Segments:
    plan = TASK.output_plan(signature({"output0": HEAD, "output1": PROTOS}), model())
    config = model()
    resolved = TASK.resolve(
        SegmentOptions(min_score=0.5, **options), config, config.rules(Settings())
    )
    result: Segments = TASK.map(found, plan, frame, resolved, model())
    return result


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_masks_of_the_kept_candidates_inside_their_boxes(layout: str) -> None:
    result = run(outputs(layout), Frame(128, 128, None, (64, 64)))
    assert [i.score for i in result.instances] == pytest.approx([0.9, 0.8])
    left, top_right = (masks.rle_decode([i.mask.height, i.mask.width], i.mask.counts or "")
                       for i in result.instances)  # fmt: skip
    expected = np.zeros((128, 128), bool)
    expected[:, :64] = True
    assert np.array_equal(left, expected)
    expected = np.zeros((128, 128), bool)
    expected[:64, 64:] = True
    assert np.array_equal(top_right, expected)


def test_an_exif_orientation_turns_the_masks() -> None:
    frame = Frame(128, 128, partial(orient_box, orientation=6), (64, 64))
    result = run(outputs(), frame)
    left = masks.rle_decode([128, 128], result.instances[0].mask.counts or "")
    expected = np.zeros((128, 128), bool)
    expected[:64, :] = True  # the stored left half is shown on top
    assert np.array_equal(left, expected)


def test_bad_heads_are_output_errors() -> None:
    frame = Frame(64, 64, None, (64, 64))
    bad = outputs()
    bad["output1"] = np.zeros((1, 2, 5, 30), np.float32)
    with pytest.raises(OutputError, match="aspect"):
        run(bad, frame)
    bad = outputs()
    bad["output0"] = bad["output0"][:, :6]
    with pytest.raises(OutputError, match="cannot hold"):
        run(bad, frame)
    bad = outputs()
    bad["output1"][0, 0, 0, 0] = np.nan
    with pytest.raises(OutputError, match="NaN"):
        run(bad, frame)
    with pytest.raises(OutputError, match="size of the image sent"):
        run(outputs(), Frame(64, 64))
