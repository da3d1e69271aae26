"""The HTTP door's page as assembled in-process (gateway/frontends/http/page.py): each task's
renderer is its binding's page.js, a script that would end the page's <script> element is
refused, the option inputs are typed from the request message, and the pipelines are offered.
The page in a browser: test_page_renderers.py, test_http_browser.py, test_page_pipelines.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from google.protobuf import type_pb2

from gateway.core.cascade import Cascade, Step
from gateway.frontends.http import page
from gateway.models import default_registry
from gateway.models.pipelines import PipelineConfig, StepConfig
from gateway.tasks.builtin import BUILT_IN, built_in_tasks

TASKS = Path(__file__).resolve().parents[3] / "gateway" / "tasks"
# task: its folder
FOLDERS = {
    "detection": "detection",
    "classification": "classification",
    "instance_segmentation": "segmentation",
    "keypoints": "keypoints",
    "embedding": "embedding",
}


def test_each_built_in_binding_carries_its_folder_s_page_js() -> None:
    registry = default_registry("detector", default_task="detection")
    html = page.render(registry, BUILT_IN)
    for binding in BUILT_IN:
        script = (TASKS / FOLDERS[binding.task] / "page.js").read_text()
        assert binding.page == script, binding.task
        assert f'RENDERERS["{binding.verb}"] = async (result, view) => {{\n{script}' in html


def test_a_page_script_that_would_end_the_script_element_is_refused() -> None:
    bad = dataclasses.replace(BUILT_IN.for_task("detection"), page='view.row("</SCRIPT>");')
    with pytest.raises(ValueError, match="page script of the detection binding contains"):
        page.renderers([bad])


def test_the_page_s_option_inputs_are_typed_from_the_request_message() -> None:
    detect = BUILT_IN.for_task("detection")
    assert [(o["name"], o["kind"]) for o in page.options(detect)] == [
        ("min_score", "number"),
        ("max_detections", "integer"),
    ]
    assert page.options(detect)[0]["description"] == detect.options["min_score"]
    # An enum (here google.protobuf.Field's Cardinality) is a choice of its named values; its
    # zero value is the input left empty.
    with_enum = dataclasses.replace(
        detect,
        request_type=type_pb2.Field,
        options_type=lambda cardinality, name: (cardinality, name),
        options={"cardinality": "how many", "name": "who"},
    )
    assert page.options(with_enum) == [
        {
            "name": "cardinality",
            "kind": "choice",
            "description": "how many",
            "choices": [
                [1, "CARDINALITY_OPTIONAL"],
                [2, "CARDINALITY_REQUIRED"],
                [3, "CARDINALITY_REPEATED"],
            ],
        },
        {"name": "name", "kind": "text", "description": "who"},
    ]


def test_the_page_offers_each_pipeline_with_its_run_s_options() -> None:
    """The checked pipelines: first model, the verb whose renderer draws its answer, the steps,
    and the run's options described as the first model's task describes them; where a
    pipeline's answer holds each task's own answer, from the messages."""
    tasks = built_in_tasks()
    classify = tasks["classification"]
    step = Step(StepConfig("colour", "classifier_scores"), classify, None)
    config = PipelineConfig("boxes", "detector", {}, (step.config,))
    cascade = Cascade(config, tasks["detection"], {}, (step,))
    html = page.render(default_registry("detector", default_task="detection"), BUILT_IN,
                       cascades={"boxes": cascade})  # fmt: skip
    detect = BUILT_IN.for_task("detection")
    shown = page.pipelines({"boxes": cascade}, BUILT_IN)
    assert shown == {
        "boxes": {
            "detect": "detector",
            "verb": "detect",
            "steps": [{"name": "colour", "model": "classifier_scores"}],
            "options": [
                {"name": "min_score", "kind": "number", "description": detect.options["min_score"]},
                {"name": "max_detections", "kind": "integer",
                 "description": detect.options["max_detections"]},
            ],
        }
    }  # fmt: skip
    assert f"const PIPELINES = {page._script_json(shown)};" in html
    assert page.answers(BUILT_IN) == {
        "first": {
            "detections": ["detect", "detections"],
            "segments": ["segment", "instances"],
            "keypoints": ["keypoints", "instances"],
        },
        "steps": ["classes", "embedding", "keypoints", "detections", "segments"],
    }
    # Without pipelines the list is empty (the page then shows models only).
    plain = page.render(default_registry("detector", default_task="detection"), BUILT_IN)
    assert "const PIPELINES = {};" in plain
