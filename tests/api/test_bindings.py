"""A binding makes the pipeline's Request from its request message: the image, the model and
the task's options type made from the fields its `options` name (no per-task conversion code)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest

from gateway.api.bindings import Binding, model_spec
from gateway.domain import ModelRef
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.builtin import BUILT_IN

# A value per option type that differs from the field's default, so a dropped option shows.
VALUES = {float: 0.25, int: 7, str: "png", bool: True}


@pytest.mark.parametrize("verb", BUILT_IN.verbs)
def test_to_request_carries_every_option_the_binding_names(verb: str) -> None:
    binding = BUILT_IN.for_verb(verb)
    fields = binding.request_type.DESCRIPTOR.fields_by_name
    options = {}
    for name in binding.options:
        python_type = {1: float, 2: float, 3: int, 5: int, 9: str, 8: bool, 13: int}[
            fields[name].type
        ]
        options[name] = VALUES[python_type]
    message = binding.request(b"\xff\xd8jpeg", model_spec("m", version=3), "id-1", **options)

    request = binding.to_request(message, "id-1", "Call", 2.5, (("traceparent", "t"),))

    assert request.image == b"\xff\xd8jpeg"
    assert request.model == ModelRef("m", 3, None)
    assert isinstance(request.options, binding.options_type)
    assert request.options._asdict() == pytest.approx(options)
    assert (request.request_id, request.method, request.timeout) == ("id-1", "Call", 2.5)
    assert request.trace == (("traceparent", "t"),)


def test_a_binding_whose_options_type_does_not_match_its_options_is_refused() -> None:
    class Swapped(NamedTuple):
        max_detections: int = 0
        min_score: float = 0.0

    detect = BUILT_IN.for_verb("detect")
    with pytest.raises(ValueError, match="are not its options"):
        dataclasses.replace(detect, options_type=Swapped)


def test_a_binding_of_a_proto_without_one_service_is_refused() -> None:
    detect = BUILT_IN.for_verb("detect")
    with pytest.raises(ValueError, match=r"tfserving\.proto has 0 services"):
        Binding.of(tfs.DESCRIPTOR, detect.options_type, detect.fill_result, summary="Detect")


def test_an_option_without_its_help_is_refused_naming_it() -> None:
    class Bare(NamedTuple):
        min_score: float = 0.0
        max_detections: int = 0

    detect = BUILT_IN.for_verb("detect")
    with pytest.raises(ValueError, match=r"Bare.min_score has no help"):
        Binding.of(pb.DESCRIPTOR, Bare, detect.fill_result, summary="Detect")


def test_a_binding_takes_its_names_page_and_drawing_from_its_proto_and_folder() -> None:
    detect = BUILT_IN.for_verb("detect")
    again = Binding.of(pb.DESCRIPTOR, detect.options_type, detect.fill_result, summary="Detect")
    assert (again.task, again.verb, again.unary, again.stream) == (
        "detection", "detect", "Detect", "DetectStream",
    )  # fmt: skip
    assert (again.request_type, again.result_type) == (pb.DetectRequest, pb.DetectionResult)
    assert again.page == detect.page and again.page.strip()
    assert again.draw is detect.draw is not None
    assert again.options == {
        "min_score": "minimum score, 0..1 (0: the model's default)",
        "max_detections": "most detections returned (0: the model's default)",
    }
