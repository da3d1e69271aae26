"""The jobs API's conversions (gateway.jobs.spec.conversions): a CreateBatchJobRequest names
its task by verb and carries the task's request message as its options; the HTTP door's JSON
may give them as a plain object. What does not fit is INVALID_INPUT naming it, never dropped."""

from __future__ import annotations

import json

import pytest
from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message

from gateway.domain import ModelRef
from gateway.errors import GatewayError, Kind
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.conversions import from_json, to_request
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.proto.pipeline.v1 import pipeline_pb2 as ppb
from gateway.proto.vision.v1 import batch_pb2 as bpb
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.builtin import BUILT_IN


def packed(message: Message) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def refusal(call: object, *args: object) -> str:
    with pytest.raises(GatewayError) as info:
        call(*args)  # type: ignore[operator]
    assert info.value.kind == Kind.INVALID_INPUT
    return info.value.message


def test_the_task_is_named_by_its_verb_and_its_options_are_its_request() -> None:
    request = bpb.CreateBatchJobRequest(
        input_uri="/data", task="classify", options=packed(cpb.ClassifyRequest(top_k=3))
    )
    spec = to_request(request, BUILT_IN).spec
    assert spec.task == "classification"
    assert dict(spec.options) == {"top_k": 3, "min_score": 0.0}
    embed = bpb.CreateBatchJobRequest(
        input_uri="/data", task="embed", options=packed(epb.EmbedRequest(dimensions=16))
    )
    assert dict(to_request(embed, BUILT_IN).spec.options) == {"dimensions": 16}


def test_no_task_is_the_first_binding_and_no_options_the_defaults() -> None:
    spec = to_request(bpb.CreateBatchJobRequest(input_uri="/data"), BUILT_IN).spec
    assert spec.task == next(iter(BUILT_IN)).task == "detection"
    assert dict(spec.options) == {"min_score": 0.0, "max_detections": 0}


def test_another_tasks_options_an_unknown_task_and_stray_fields_are_refused() -> None:
    wrong = bpb.CreateBatchJobRequest(
        input_uri="/data", task="detect", options=packed(cpb.ClassifyRequest(top_k=3))
    )
    message = refusal(to_request, wrong, BUILT_IN)
    assert "options must be a detection.v1.DetectRequest for task detect" in message
    assert "got classification.v1.ClassifyRequest" in message
    unknown = bpb.CreateBatchJobRequest(input_uri="/data", task="TASK_DETECT")
    assert "task must be one of detect, classify" in refusal(to_request, unknown, BUILT_IN)
    for stray, name in (
        (pb.DetectRequest(image=b"x"), "image"),
        (pb.DetectRequest(request_id="r"), "request_id"),
        (pb.DetectRequest(model=model_pb2.ModelSpec(name="m")), "model"),
    ):
        request = bpb.CreateBatchJobRequest(input_uri="/data", options=packed(stray))
        assert f"options sets {name}" in refusal(to_request, request, BUILT_IN)
    broken = bpb.CreateBatchJobRequest(input_uri="/data")
    broken.options.type_url = "type.googleapis.com/detection.v1.DetectRequest"
    broken.options.value = b"\xff\xff"
    assert "not a valid detection.v1.DetectRequest" in refusal(to_request, broken, BUILT_IN)


def body(data: object) -> bytes:
    return json.dumps(data).encode()


def test_http_json_takes_options_as_a_plain_object_or_an_any() -> None:
    given = {"task": "classify", "options": {"topK": 2, "min_score": 0.5}}
    plain = from_json(body(given), BUILT_IN)
    found = cpb.ClassifyRequest()
    assert plain.options.Unpack(found) and (found.top_k, found.min_score) == (2, 0.5)
    any_form = {"@type": "type.googleapis.com/detection.v1.DetectRequest", "maxDetections": 4}
    message = from_json(body({"upload_id": "u", "options": any_form}), BUILT_IN)
    detect = pb.DetectRequest()
    assert message.options.Unpack(detect) and detect.max_detections == 4
    assert json_format.MessageToDict(message)["uploadId"] == "u"


def test_http_json_refuses_what_it_cannot_place_by_name() -> None:
    message = refusal(from_json, body({"options": {"min_score": 0.5, "top_k": 3}}), BUILT_IN)
    assert message == (
        "options.top_k is not an option of task detect (its options: min_score, max_detections)"
    )
    assert "task must be one of" in refusal(from_json, body({"task": "x", "options": {}}), BUILT_IN)
    assert "not a CreateBatchJobRequest" in refusal(from_json, body({"shardz": 2}), BUILT_IN)
    assert "not JSON text" in refusal(from_json, b"\xff{", BUILT_IN)
    assert "not a JSON object" in refusal(from_json, b"[]", BUILT_IN)
    deep = b"[" * 30000 + b"]" * 30000
    assert "not JSON text" in refusal(from_json, deep, BUILT_IN)
    nested = b'{"options": {"min_score": ' + b"[" * 30000 + b"]" * 30000 + b"}}"
    refusal(from_json, nested, BUILT_IN)
    bad_value = body({"options": {"min_score": "high"}})
    assert "min_score" in refusal(from_json, bad_value, BUILT_IN)


def test_a_pipeline_job_names_its_pipeline_and_takes_the_first_models_options() -> None:
    request = bpb.CreateBatchJobRequest(
        input_uri="/data", pipeline="vehicles", options=packed(ppb.RunRequest(min_score=0.4))
    )
    spec = to_request(request, BUILT_IN).spec
    assert (spec.task, spec.pipeline, spec.model) == ("pipeline", "vehicles", ModelRef("vehicles"))
    assert dict(spec.options) == {"min_score": pytest.approx(0.4), "max_detections": 0}
    assert spec.binding(BUILT_IN).request(b"x", model_pb2.ModelSpec(name="vehicles"), "r") == (
        ppb.RunRequest(image=b"x", pipeline="vehicles", request_id="r")
    )
    assert JobSpec.from_json(spec.to_json()) == spec
    body = b'{"input_uri": "/data", "pipeline": "vehicles", "options": {"maxDetections": 5}}'
    http = from_json(body, BUILT_IN)
    assert dict(to_request(http, BUILT_IN).spec.options)["max_detections"] == 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"task": "detect"}, "task 'detect' and pipeline 'vehicles' are both set"),
        ({"model": model_pb2.ModelSpec(name="detector")},
         "model and pipeline 'vehicles' are both set"),
        ({"options": packed(pb.DetectRequest(min_score=0.4))},
         "options must be a pipeline.v1.RunRequest for task pipeline"),
        ({"options": packed(ppb.RunRequest(pipeline="other"))}, "options sets pipeline"),
    ],
)  # fmt: skip
def test_a_pipeline_job_refuses_a_task_a_model_and_other_options(
    fields: dict[str, object], message: str
) -> None:
    request = bpb.CreateBatchJobRequest(input_uri="/data", pipeline="vehicles", **fields)
    assert message in refusal(to_request, request, BUILT_IN)


def test_a_pipeline_spec_has_no_version_or_label() -> None:
    spec = JobSpec(input="/d", output="", task="pipeline", model=ModelRef("vehicles", 2))
    with pytest.raises(GatewayError, match="pipeline 'vehicles' has no versions or labels"):
        spec.check()
    with pytest.raises(GatewayError, match="a pipeline job names its pipeline"):
        spec.replace(model=ModelRef("")).check()
