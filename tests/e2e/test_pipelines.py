"""Pipelines end to end (docs/pipelines.md): client -> gateway -> local TF Serving -> the
reference detector, then a reference classifier on each box's crop, with the gateway's
example model config (serving/gateway-models.toml: `detect_then_classify`).

Each attached result is checked against what the step's model answers for the same crop
sent on its own (Classify with the crop as PNG): same classes, scores within 1e-6.
"""

from __future__ import annotations

import base64
import json
import subprocess

import grpc
import msgpack
import numpy as np
import pytest

from gateway.api import protojson
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.pipeline.v1 import pipeline_pb2 as ppb
from gateway.proto.pipeline.v1 import pipeline_pb2_grpc as ppb_grpc
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from tests.support.answers import same
from tests.support.pipelinesetup import PIPELINE, scene


def test_each_crop_is_classified_as_the_classifier_answers_it_alone(pipeline_channel):
    picture = scene()
    image = scenes.encode(picture.pixels, "PNG")
    result = ppb_grpc.PipelineServiceStub(pipeline_channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120
    )
    assert result.pipeline == PIPELINE
    assert result.WhichOneof("first") == "detections"
    direct = pb_grpc.DetectionServiceStub(pipeline_channel).Detect(
        pb.DetectRequest(image=image, model=model_pb2.ModelSpec(name="detector"), min_score=0.5),
        timeout=120,
    )
    detections = result.detections.detections
    assert len(detections) >= 4
    assert [(d.label, d.box) for d in detections] == [(d.label, d.box) for d in direct.detections]
    assert len(result.instances) == len(detections)
    classify = cpb_grpc.ClassificationServiceStub(pipeline_channel)
    for instance, detection in zip(result.instances, detections, strict=True):
        step = instance.steps["colour"]
        assert (step.parent, step.step) == (instance.id, "colour")
        box = detection.box
        assert (step.crop.x_min, step.crop.y_min, step.crop.x_max, step.crop.y_max) == (
            box.x_min, box.y_min, box.x_max, box.y_max,
        )  # fmt: skip
        crop = picture.pixels[box.y_min : box.y_max, box.x_min : box.x_max]
        alone = classify.Classify(
            cpb.ClassifyRequest(
                image=scenes.encode(crop, "PNG"),
                model=model_pb2.ModelSpec(name="classifier_scores"),
                top_k=3,
            ),
            timeout=120,
        )
        got = step.classes
        assert [c.label for c in got.classes] == [c.label for c in alone.classes]
        for a, b in zip(got.classes, alone.classes, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-6)
        # A solid rectangle of one palette colour is that colour.
        assert got.classes[0].label == detection.label.removesuffix(" box")
    (report,) = result.steps
    assert report.name == "colour" and report.crops == len(detections) and report.failed == 0
    assert report.model.name == "classifier_scores" and report.model.version == 1


def test_labels_min_size_and_max_crops_skip_and_say_so(pipeline_channel):
    picture = scene(5)
    image = scenes.encode(picture.pixels, "PNG")
    result = ppb_grpc.PipelineServiceStub(pipeline_channel).Run(
        ppb.RunRequest(image=image, pipeline="only_red", min_score=0.5), timeout=120
    )
    detections = result.detections.detections
    (report,) = result.steps
    skipped = {s.reason: list(s.ids) for s in report.skipped}
    red = [i for i, d in enumerate(detections) if d.label == "red box"]
    sides = [min(d.box.x_max - d.box.x_min, d.box.y_max - d.box.y_min) for d in detections]
    large = [i for i in red if sides[i] >= 30]
    # Seed 5 has four red boxes, three of them at least 30 px on each side.
    assert len(red) == 4 and len(large) == 3
    assert skipped["label"] == [i for i, d in enumerate(detections) if d.label != "red box"]
    assert skipped["min_size"] == [i for i in red if i not in large]
    assert [i for i, instance in enumerate(result.instances) if instance.steps] == large[:1]
    assert skipped["max_crops"] == large[1:]
    assert report.crops == 1
    for i in large[:1]:
        step = result.instances[i].steps["colour"]
        box = detections[i].box
        pad_x, pad_y = 0.25 * (box.x_max - box.x_min), 0.25 * (box.y_max - box.y_min)
        assert step.crop.x_min == max(0, int(np.floor(box.x_min - pad_x)))
        assert step.crop.y_max == min(480, int(np.ceil(box.y_max + pad_y)))


def test_a_failing_step_marks_each_crop_and_the_image_is_still_answered(pipeline_channel):
    image = scenes.encode(scene().pixels, "PNG")
    stub = ppb_grpc.PipelineServiceStub(pipeline_channel)
    result = stub.Run(ppb.RunRequest(image=image, pipeline="missing_step"), timeout=120)
    assert len(result.detections.detections) >= 4
    for instance in result.instances:
        step = instance.steps["colour"]
        assert step.WhichOneof("result") is None
        assert step.error.code == grpc.StatusCode.NOT_FOUND.value[0], step.error
        assert "no_such_model" in step.error.message
    assert result.steps[0].failed == len(result.instances)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Run(ppb.RunRequest(image=image, pipeline="missing_required"), timeout=120)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_an_unknown_pipeline_is_not_found_naming_the_ones_there_are(pipeline_channel):
    stub = ppb_grpc.PipelineServiceStub(pipeline_channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Run(ppb.RunRequest(image=b"x", pipeline="nope"), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert PIPELINE in caught.value.details()


def _curl(url: str, *args: str) -> tuple[int, bytes]:
    """The real curl: (HTTP status, body)."""
    done = subprocess.run(
        ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *args, url],
        capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    body, _, status = done.stdout.rpartition(b"\n")
    return int(status), body


@pytest.fixture(scope="module")
def grpc_answer(pipeline_channel) -> tuple[bytes, dict]:
    """A scene and the gRPC door's answer for it, as proto JSON."""
    image = scenes.encode(scene().pixels, "PNG")
    result = ppb_grpc.PipelineServiceStub(pipeline_channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="same"), timeout=120
    )
    return image, protojson.to_dict(result)


def test_every_http_body_answers_as_grpc_does(pipeline_gateway, grpc_answer, tmp_path):
    image, expected = grpc_answer
    path = tmp_path / "scene.png"
    path.write_bytes(image)
    url = f"{pipeline_gateway.http_url}/v1/pipelines/{PIPELINE}:run"
    raw = _curl(url, "-H", "Content-Type: image/png", "-H", "x-request-id: same",
                "--data-binary", f"@{path}")  # fmt: skip
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"image": base64.b64encode(image).decode(), "request_id": "same"}))
    as_json = _curl(url, "-H", "Content-Type: application/json", "--data-binary", f"@{body}")
    form = _curl(url, "-F", f"image=@{path}", "-F", "request_id=same")
    invocations = _curl(
        f"{pipeline_gateway.http_url}/invocations?pipeline={PIPELINE}&request_id=same",
        "-H", "Content-Type: image/png", "--data-binary", f"@{path}",
    )  # fmt: skip
    for status, answer in (raw, as_json, form, invocations):
        assert status == 200, answer
        assert json.loads(answer) == expected
    packed = tmp_path / "body.msgpack"
    packed.write_bytes(msgpack.packb({"image": image, "request_id": "same", "tag": 7}))
    status, answer = _curl(url, "-H", "Content-Type: application/msgpack",
                           "--data-binary", f"@{packed}")  # fmt: skip
    assert status == 200, answer
    unpacked = msgpack.unpackb(answer)
    assert unpacked.pop("metadata") == {"tag": 7}
    same(unpacked, expected, "msgpack")


def test_http_refusals_name_what_to_change(pipeline_gateway):
    url = f"{pipeline_gateway.http_url}/v1/pipelines/nope:run"
    status, answer = _curl(url, "-H", "Content-Type: image/png", "--data-binary", "x")
    assert status == 404 and PIPELINE in json.loads(answer)["error"]["message"]
    url = f"{pipeline_gateway.http_url}/v1/pipelines/{PIPELINE}:run"
    body = json.dumps({"image": "", "pipeline": "other"})
    status, answer = _curl(url, "-H", "Content-Type: application/json", "--data-binary", body)
    assert status == 400 and "path names" in json.loads(answer)["error"]["message"]


def test_run_stream_answers_in_order_with_per_image_errors(pipeline_channel):
    image = scenes.encode(scene().pixels, "PNG")
    requests = [
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="a"),
        ppb.RunRequest(image=b"\x89PNG broken", pipeline=PIPELINE, request_id="b"),
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="d", max_detections=2),
    ]
    results = list(
        ppb_grpc.PipelineServiceStub(pipeline_channel).RunStream(iter(requests), timeout=120)
    )
    assert [r.request_id for r in results] == ["a", "b", "d"]
    assert len(results[0].instances) >= 4 and results[0].steps[0].crops == len(results[0].instances)
    assert results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    # A request's options are the first model's: fewer instances, each still classified.
    kept = results[2].detections.detections
    assert len(results[2].instances) == len(kept) == 2
    assert all(instance.steps["colour"].classes.classes for instance in results[2].instances)
