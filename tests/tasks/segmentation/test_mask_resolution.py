"""`mask_resolution` of decoder = "yolo-seg": the config key (default "native", refused by
name with any other value or without that decoder), the plan that carries it, and the
"input" mode's masks against Ultralytics' predictor-default way written here in numpy from
ultralytics/utils/ops.py: process_mask with upsample=True (the logits upsampled to the input
by F.interpolate's bilinear, align_corners=False; > 0; crop_mask on pixel indices x1 <= c <
x2 with the input's box), then scale_masks of that 0/1 mask, cut to the part of the input
the image fills, to the image (> 0.5, as plotting's Annotator.masks): stretched, letterboxed
and through an EXIF orientation. tests/zoo/test_segmentation_zoo.py compares both modes with
the library itself."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.config import Settings
from gateway.core.letterbox import unletterbox
from gateway.domain import Frame
from gateway.imaging.orientation import orient_box
from gateway.models import ModelConfig
from gateway.models.values import ModelConfigError
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.segmentation import TASK
from gateway.tasks.segmentation.config import SegmentationConfig
from gateway.tasks.segmentation.nouns import SegmentOptions
from gateway.tasks.segmentation.plans import SegmentationPlan
from gateway.upstream.signatures import Signature, TensorSpec
from tests.support import masks

F = tfs.DT_FLOAT
SENT = 64  # the image sent is SENT x SENT; the prototypes a quarter of it
M = 3


def read(table: dict[str, Any]) -> SegmentationConfig:
    config: SegmentationConfig = TASK.read_config(
        {"task": "instance_segmentation", **table}, Path("models.toml"), "models.seg"
    )
    return config


def model(resolution: str) -> ModelConfig:
    config = read({"outputs": {"decoder": "yolo-seg", "mask_resolution": resolution}})
    return ModelConfig("m", TASK.name, task_config=config)


def plan_of(config: ModelConfig) -> SegmentationPlan:
    signature = Signature(
        "m", 1, {"images": TensorSpec(tfs.DT_UINT8, (1, SENT, SENT, 3))},
        {"output0": TensorSpec(F, (1, 5 + M, -1)), "output1": TensorSpec(F, (1, M, 16, 16))},
    )  # fmt: skip
    plan = TASK.output_plan(signature, config)
    assert isinstance(plan, SegmentationPlan)
    return plan


def test_the_key_defaults_to_native_and_is_refused_where_it_means_nothing() -> None:
    assert read({"outputs": {"decoder": "yolo-seg"}}).mask_resolution == "native"
    assert plan_of(model("input")).mask_resolution == "input"
    assert "upsampled to the input" in str(plan_of(model("input")).describe()["masks"])
    assert "native" in str(plan_of(model("native")).describe()["masks"])
    for table, message in (
        ({"outputs": {"mask_resolution": "input"}}, "outputs.mask_resolution chooses how"),
        ({"outputs": {"decoder": "yolo-seg", "mask_resolution": "retina"}},
         "outputs.mask_resolution must be one of 'native', 'input'"),
        ({"outputs": {"decoder": "yolo-seg", "mask_resolution": 1}}, "must be one of"),
    ):  # fmt: skip
        with pytest.raises(ModelConfigError, match=r"models\.toml: models\.seg\.") as info:
            read(table)
        assert message in str(info.value)


def interpolate(values: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """torch.nn.functional.interpolate(mode="bilinear", align_corners=False) of [n, h, w] in
    float32 as PyTorch's CPU kernel computes it: scale = in / out in float32, source =
    (destination + 0.5) * scale - 0.5 rounded once (a fused multiply-add), at least 0; the
    upper tap stops at the last cell; width first, then height. (The zoo checks the gateway
    against torch itself; a 0/1 mask resized puts samples at exactly 0.5, where the rounding
    decides.)"""

    def taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if n_in == n_out:
            same = np.arange(n_out)
            return same, same, np.zeros(n_out, np.float32)
        scale = float(np.float32(n_in) / np.float32(n_out))
        exact = (np.arange(n_out) + 0.5) * scale - 0.5
        source = np.maximum(exact.astype(np.float32), np.float32(0))
        low = np.minimum(np.floor(source).astype(int), n_in - 1)
        return low, np.minimum(low + 1, n_in - 1), source - low.astype(np.float32)

    values = values.astype(np.float32)
    low, high, weight = taps(values.shape[2], size[1])
    across = values[:, :, low] * (1 - weight) + values[:, :, high] * weight
    low, high, weight = taps(values.shape[1], size[0])
    result: np.ndarray = (across[:, low] * (1 - weight)[:, None]
                          + across[:, high] * weight[:, None])  # fmt: skip
    return result


def input_way(head: np.ndarray, protos: np.ndarray, content: tuple[int, int],
              shown: tuple[int, int]) -> np.ndarray:  # fmt: skip
    """Ultralytics' retina_masks=False masks of the head's candidates on an image shown at
    `shown` (height, width) that fills `content` (height, width) of the input's top left."""
    logits = head[5:].T @ protos.reshape(M, -1)
    upsampled = interpolate(logits.reshape(-1, *protos.shape[1:]), (SENT, SENT)) > 0.0
    cx, cy, w, h = head[:4]
    x1, y1, x2, y2 = (v[:, None, None] for v in (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
    c, r = np.arange(SENT)[None, None, :], np.arange(SENT)[None, :, None]
    cropped = upsampled & (c >= x1) & (c < x2) & (r >= y1) & (r < y2)
    cut = cropped[:, : content[0], : content[1]].astype(np.float32)
    shown_masks: np.ndarray = interpolate(cut, shown) > 0.5
    return shown_masks


def outputs() -> tuple[np.ndarray, np.ndarray]:
    """Random prototypes over the image sent and candidates far apart (NMS keeps them all),
    best first."""
    rng = np.random.default_rng(43)
    protos = rng.normal(0.0, 3.0, (M, SENT // 4, SENT // 4)).astype(np.float32)
    boxes = [(17.3, 15.2, 30.5, 27.1), (46.6, 20.0, 30.1, 38.7), (30.0, 50.2, 50.0, 20.9)]
    columns = [[*box, 0.9 - 0.1 * i, *rng.normal(0.0, 1.0, M)] for i, box in enumerate(boxes)]
    return np.asarray(columns, np.float32).T, protos


def gateway_masks(frame: Frame, resolution: str) -> list[np.ndarray]:
    head, protos = outputs()
    config = model(resolution)
    resolved = TASK.resolve(SegmentOptions(min_score=0.5), config, config.rules(Settings()))
    found = {"output0": head[None], "output1": protos[None]}
    result = TASK.map(found, plan_of(config), frame, resolved, config)
    return [masks.rle_decode([i.mask.height, i.mask.width], i.mask.counts or "")
            for i in result.instances]  # fmt: skip


# (height, width) shown: smaller and larger than the input, its size, and tiny (a displayed
# pixel over two sent pixels: the kept region's margin).
SHOWN = [(50, 75), (150, 90), (64, 64), (20, 30), (9, 13), (12, 17), (5, 31)]


@pytest.mark.parametrize("shown", SHOWN)
def test_input_masks_are_ultralytics_process_mask_then_scale_masks(
    shown: tuple[int, int],
) -> None:
    head, protos = outputs()
    height, width = shown
    expected = input_way(head, protos, (SENT, SENT), shown)
    got = gateway_masks(Frame(width, height, None, (SENT, SENT)), "input")
    assert len(got) == 3 and all(m.any() for m in expected)
    for mine, theirs in zip(got, expected, strict=True):
        assert np.array_equal(mine, theirs)


def test_input_masks_of_a_letterboxed_image_leave_the_padding_out() -> None:
    head, protos = outputs()
    # 100x50 shown, letterboxed on the 64x64 input: content 64x32 at the top left.
    frame = Frame(100, 50, partial(unletterbox, y_scale=SENT / 32, x_scale=1.0), (SENT, SENT))
    expected = input_way(head, protos, (32, SENT), (50, 100))
    got = gateway_masks(frame, "input")
    assert sum(m.any() for m in expected) >= 2
    for mine, theirs in zip(got, expected, strict=True):
        assert np.array_equal(mine, theirs)


def test_an_exif_orientation_turns_the_input_masks() -> None:
    plain = gateway_masks(Frame(75, 50, None, (SENT, SENT)), "input")
    turned = gateway_masks(Frame(50, 75, partial(orient_box, orientation=6), (SENT, SENT)),
                           "input")  # fmt: skip
    for mine, upright in zip(turned, plain, strict=True):
        assert np.array_equal(mine, np.rot90(upright, k=-1))  # stored left is shown on top


def test_the_two_resolutions_give_different_masks() -> None:
    frame = Frame(150, 90, None, (SENT, SENT))
    native, at_input = gateway_masks(frame, "native"), gateway_masks(frame, "input")
    ious = [masks.iou(a, b) for a, b in zip(native, at_input, strict=True)]
    assert min(ious) < 0.98 and min(ious) > 0.5, ious
