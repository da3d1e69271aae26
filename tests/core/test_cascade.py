"""Which instances a pipeline's step looks at, and the crop it cuts for each (the rest of
gateway.core.cascade runs end to end in tests/e2e/test_pipelines.py)."""

from __future__ import annotations

from typing import NamedTuple

from gateway.core.cascade import _choose
from gateway.domain import StepSummary
from gateway.models.pipelines import StepConfig


class Found(NamedTuple):
    class_id: int
    label: str
    score: float
    box: tuple[int, int, int, int]


INSTANCES = [
    Found(1, "car", 0.9, (10, 10, 110, 60)),  # 100 x 50
    Found(2, "person", 0.8, (200, 20, 230, 100)),  # 30 x 80
    Found(1, "car", 0.7, (300, 300, 310, 340)),  # 10 x 40: small
    Found(1, "car", 0.6, (0, 380, 60, 400)),  # 60 x 20, at the bottom-left corner
    Found(3, "truck", 0.5, (400, 100, 500, 200)),
]


def chosen(step: StepConfig) -> tuple[list[tuple[int, tuple[int, int, int, int]]], dict]:
    summary = StepSummary(step.name, "classification")
    picked = _choose(step, INSTANCES, summary, 640, 400)
    return picked, summary.skipped


def test_every_instance_by_default_each_cropped_to_its_box():
    picked, skipped = chosen(StepConfig("s", "m"))
    assert picked == [(i, found.box) for i, found in enumerate(INSTANCES)]
    assert skipped == {}


def test_labels_min_size_and_max_crops_skip_and_say_which():
    step = StepConfig("s", "m", labels=frozenset({"car", "truck"}), min_size=15, max_crops=2)
    picked, skipped = chosen(step)
    assert [index for index, _ in picked] == [0, 3]
    assert skipped == {"label": [1], "min_size": [2], "max_crops": [4]}


def test_padding_widens_the_crop_within_the_image():
    picked, _ = chosen(StepConfig("s", "m", padding=0.5))
    boxes = dict(picked)
    assert boxes[0] == (0, 0, 160, 85)  # 50 px each side, clamped at 0
    assert boxes[3] == (0, 370, 90, 400)  # clamped at the image's bottom
    assert boxes[1] == (185, 0, 245, 140)
