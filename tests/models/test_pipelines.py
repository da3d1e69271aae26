"""`[pipelines.NAME]` in the model config file: read with its defaults, and every mistake
refused naming the pipeline and the key."""

from __future__ import annotations

import pytest

from gateway.models import ModelConfigError, load_registry
from gateway.models.pipelines import DEFAULT_MAX_CROPS, MAX_CROPS_LIMIT, StepConfig
from tests.support.modelconfigs import TASKS, config

MODELS = '[models.det]\ntask = "detection"\n[models.cls]\ntask = "classification"\n'
GOOD = """
[pipelines.cars]
detect = "det"
min_score = 0.4
[[pipelines.cars.steps]]
name = "make"
model = "cls"
labels = ["car", "truck"]
padding = 0.1
min_size = 16
max_crops = 8
required = true
top_k = 1
[[pipelines.cars.steps]]
name = "colour"
model = "cls"
"""


def test_a_pipeline_is_read_with_its_steps_and_defaults(tmp_path):
    registry = load_registry(config(tmp_path, MODELS + GOOD), "det", tasks=TASKS)
    pipeline = registry.pipelines["cars"]
    assert (pipeline.detect, dict(pipeline.options)) == ("det", {"min_score": 0.4})
    make, colour = pipeline.steps
    assert make == StepConfig(
        "make", "cls", frozenset({"car", "truck"}), 0.1, 16, 8, True, {"top_k": 1}
    )
    assert colour == StepConfig("colour", "cls")
    assert colour.max_crops == DEFAULT_MAX_CROPS and colour.labels is None


BAD = {
    "no detect": ("detect = \"det\"\n", "", "pipelines.cars.detect must name the first model"),
    "bad step name": ('name = "make"', 'name = "Make It"', "steps[0].name must be lower-case"),
    "no model": ('model = "cls"\nlabels', "labels", "steps 'make': model must name"),
    "labels not a list": ('labels = ["car", "truck"]', 'labels = "car"', "labels must be a list"),
    "padding over 1": ("padding = 0.1", "padding = 2", "padding must be a share of the box"),
    "min_size 0": ("min_size = 16", "min_size = 0", "min_size must be a whole number"),
    "max_crops over the ceiling": (
        "max_crops = 8", f"max_crops = {MAX_CROPS_LIMIT + 1}",
        f"max_crops must be a whole number from 1 to {MAX_CROPS_LIMIT}",
    ),
    "required not a bool": ("required = true", 'required = "yes"', "required must be true or"),
    "two steps one name": ('name = "colour"', 'name = "make"', "two steps named 'make'"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_a_mistake_is_refused_naming_the_key(tmp_path, case):
    old, new, message = BAD[case]
    text = MODELS + GOOD.replace(old, new, 1)
    with pytest.raises(ModelConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_registry(config(tmp_path, text), "det", tasks=TASKS)


def test_a_pipeline_name_must_fit_a_route(tmp_path):
    text = MODELS + GOOD.replace("pipelines.cars", 'pipelines."cars/x"')
    with pytest.raises(ModelConfigError, match="part of the HTTP route"):
        load_registry(config(tmp_path, text), "det", tasks=TASKS)


def test_a_pipeline_without_steps_is_refused(tmp_path):
    text = MODELS + GOOD[: GOOD.index("[[pipelines.cars.steps]]")]
    with pytest.raises(ModelConfigError, match=r"needs at least one \[\[pipelines.cars.steps\]\]"):
        load_registry(config(tmp_path, text), "det", tasks=TASKS)
