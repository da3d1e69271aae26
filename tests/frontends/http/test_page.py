"""The HTTP door's page as assembled in-process (gateway/frontends/http/page.py): each task's
renderer is its binding's page.js, a script that would end the page's <script> element is
refused, and the option inputs are typed from the request message. The page in a browser:
test_page_renderers.py and test_http_browser.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from google.protobuf import type_pb2

from gateway.frontends.http import page
from gateway.models import default_registry
from gateway.tasks.builtin import BUILT_IN

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
