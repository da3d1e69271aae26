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
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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
from serving import scenes
from tests.support.answers import same
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = ROOT / "serving" / "gateway-models.toml"
PIPELINE = "detect_then_classify"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tmp_path_factory.mktemp("pipelines") / "models.toml"
    # The example config, plus pipelines for the per-crop rules (paths stay relative to it).
    extra = """
[pipelines.only_red]
detect = "detector"
[[pipelines.only_red.steps]]
name = "colour"
model = "classifier_scores"
labels = ["red box"]
min_size = 30
max_crops = 1
padding = 0.25

[pipelines.missing_step]
detect = "detector"
[[pipelines.missing_step.steps]]
name = "colour"
model = "no_such_model"
task = "classification"

[pipelines.missing_required]
detect = "detector"
[[pipelines.missing_required.steps]]
name = "colour"
model = "no_such_model"
required = true
"""
    text = MODEL_CONFIG.read_text().replace('label_map = "', f'label_map = "{MODEL_CONFIG.parent}/')
    text = text.replace('labels = "', f'labels = "{MODEL_CONFIG.parent}/')
    config.write_text(text + extra.replace('task = "classification"\n', ""))
    return config


@pytest.fixture(scope="module")
def gateway(
    reference_serving: LocalServer, config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    logs = tmp_path_factory.mktemp("logs")
    (logs / "paylog.toml").write_text("[default]\nrate = 1.0\n")
    args = [f"--model-config={config}", f"--payload-log={logs / 'payloads.jsonl'}",
            f"--payload-log-config={logs / 'paylog.toml'}"]  # fmt: skip
    with run_gateway(reference_serving.target, args, log_dir=logs, http=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield channel


def _scene(seed: int = 3) -> scenes.Scene:
    return scenes.generate_scene(np.random.default_rng(seed), 640, 480, 6, noise_sigma=4.0)


def test_each_crop_is_classified_as_the_classifier_answers_it_alone(channel):
    scene = _scene()
    image = scenes.encode(scene.pixels, "PNG")
    result = ppb_grpc.PipelineServiceStub(channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120
    )
    assert result.pipeline == PIPELINE
    assert result.WhichOneof("first") == "detections"
    direct = pb_grpc.DetectionServiceStub(channel).Detect(
        pb.DetectRequest(image=image, model=pb.ModelSpec(name="detector"), min_score=0.5),
        timeout=120,
    )
    detections = result.detections.detections
    assert len(detections) >= 4
    assert [(d.label, d.box) for d in detections] == [(d.label, d.box) for d in direct.detections]
    assert len(result.instances) == len(detections)
    classify = cpb_grpc.ClassificationServiceStub(channel)
    for instance, detection in zip(result.instances, detections, strict=True):
        step = instance.steps["colour"]
        assert (step.parent, step.step) == (instance.id, "colour")
        box = detection.box
        assert (step.crop.x_min, step.crop.y_min, step.crop.x_max, step.crop.y_max) == (
            box.x_min, box.y_min, box.x_max, box.y_max,
        )  # fmt: skip
        crop = scene.pixels[box.y_min : box.y_max, box.x_min : box.x_max]
        alone = classify.Classify(
            cpb.ClassifyRequest(
                image=scenes.encode(crop, "PNG"),
                model=pb.ModelSpec(name="classifier_scores"),
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


def test_labels_min_size_and_max_crops_skip_and_say_so(channel):
    scene = _scene(5)
    image = scenes.encode(scene.pixels, "PNG")
    result = ppb_grpc.PipelineServiceStub(channel).Run(
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


def test_a_failing_step_marks_each_crop_and_the_image_is_still_answered(channel):
    image = scenes.encode(_scene().pixels, "PNG")
    stub = ppb_grpc.PipelineServiceStub(channel)
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


def test_an_unknown_pipeline_is_not_found_naming_the_ones_there_are(channel):
    stub = ppb_grpc.PipelineServiceStub(channel)
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
def grpc_answer(channel) -> tuple[bytes, dict]:
    """A scene and the gRPC door's answer for it, as proto JSON."""
    image = scenes.encode(_scene().pixels, "PNG")
    result = ppb_grpc.PipelineServiceStub(channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="same"), timeout=120
    )
    return image, protojson.to_dict(result)


def test_every_http_body_answers_as_grpc_does(gateway, grpc_answer, tmp_path):
    image, expected = grpc_answer
    path = tmp_path / "scene.png"
    path.write_bytes(image)
    url = f"{gateway.http_url}/v1/pipelines/{PIPELINE}:run"
    raw = _curl(url, "-H", "Content-Type: image/png", "-H", "x-request-id: same",
                "--data-binary", f"@{path}")  # fmt: skip
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"image": base64.b64encode(image).decode(), "request_id": "same"}))
    as_json = _curl(url, "-H", "Content-Type: application/json", "--data-binary", f"@{body}")
    form = _curl(url, "-F", f"image=@{path}", "-F", "request_id=same")
    invocations = _curl(
        f"{gateway.http_url}/invocations?pipeline={PIPELINE}&request_id=same",
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


def test_http_refusals_name_what_to_change(gateway):
    url = f"{gateway.http_url}/v1/pipelines/nope:run"
    status, answer = _curl(url, "-H", "Content-Type: image/png", "--data-binary", "x")
    assert status == 404 and PIPELINE in json.loads(answer)["error"]["message"]
    url = f"{gateway.http_url}/v1/pipelines/{PIPELINE}:run"
    body = json.dumps({"image": "", "pipeline": "other"})
    status, answer = _curl(url, "-H", "Content-Type: application/json", "--data-binary", body)
    assert status == 400 and "path names" in json.loads(answer)["error"]["message"]


def _check_models(upstream: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-models", f"--upstream={upstream}",
         f"--model-config={config}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def test_check_models_shows_each_pipeline_and_what_stops_one(reference_serving, config):
    done = _check_models(reference_serving.target, config)
    assert done.returncode == 1, done.stderr  # missing_step names a model TF Serving lacks
    out = done.stdout
    assert f"pipeline '{PIPELINE}': OK" in out
    assert "colour: model = classifier_scores, task = classification" in out
    assert "pipeline 'missing_step': CANNOT BE SERVED" in out
    assert "reason: its models no_such_model cannot be served" in out
    assert "2 of 4 pipelines can be served; not: missing_step, missing_required" in out


def test_check_models_refuses_a_pipeline_its_tasks_cannot_run(reference_serving, tmp_path, config):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        config.read_text()
        + """
[pipelines.backwards]
detect = "classifier_scores"
[[pipelines.backwards.steps]]
name = "boxes"
model = "detector"

[pipelines.wrong_option]
detect = "detector"
[[pipelines.wrong_option.steps]]
name = "colour"
model = "classifier_scores"
max_detections = 3
"""
    )
    out = _check_models(reference_serving.target, bad).stdout
    assert "pipeline 'backwards': CANNOT BE SERVED" in out
    assert "detect = 'classifier_scores' is a classification model, which finds no instances" in out
    assert "pipeline 'wrong_option': CANNOT BE SERVED" in out
    assert "max_detections is not an option of task classify" in out


def test_run_stream_answers_in_order_with_per_image_errors(channel):
    image = scenes.encode(_scene().pixels, "PNG")
    requests = [
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="a"),
        ppb.RunRequest(image=b"\x89PNG broken", pipeline=PIPELINE, request_id="b"),
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="d", max_detections=2),
    ]
    results = list(ppb_grpc.PipelineServiceStub(channel).RunStream(iter(requests), timeout=120))
    assert [r.request_id for r in results] == ["a", "b", "d"]
    assert len(results[0].instances) >= 4 and results[0].steps[0].crops == len(results[0].instances)
    assert results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    # A request's options are the first model's: fewer instances, each still classified.
    kept = results[2].detections.detections
    assert len(results[2].instances) == len(kept) == 2
    assert all(instance.steps["colour"].classes.classes for instance in results[2].instances)


def test_the_payload_log_holds_one_event_with_the_whole_tree(channel, gateway):
    image = scenes.encode(_scene().pixels, "PNG")
    answer = ppb_grpc.PipelineServiceStub(channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="logged-tree", min_score=0.6),
        timeout=120,
    )
    log = gateway.log_path.parent / "payloads.jsonl"
    deadline = time.monotonic() + 60
    while True:  # the log is written by a thread of its own, after the answer
        events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        mine = [e for e in events if e["requestid"].startswith("logged-tree")]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (event,) = mine  # one event for the tree: none for the first model or a crop
    assert (event["task"], event["subject"], event["code"]) == ("pipeline", PIPELINE, "OK")
    data = event["data"]
    assert data["request"]["options"] == {"min_score": pytest.approx(0.6)}
    assert data["response"]["result"] == protojson.to_dict(answer)


def test_each_step_is_counted_under_its_own_method(channel, gateway):
    image = scenes.encode(_scene().pixels, "PNG")
    answer = ppb_grpc.PipelineServiceStub(channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120
    )
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    step = f'method="Pipeline {PIPELINE}/colour"'
    requests = [line for line in text.splitlines() if line.startswith("vision_gateway_requests_")]
    counted = [line for line in requests if step in line and 'code="OK"' in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= answer.steps[0].crops
    # Each crop's request log line names it, under the call's request id.
    lines = [r for r in gateway.records() if r.get("method") == f"Pipeline {PIPELINE}/colour"]
    assert any(r["request_id"] == f"{answer.request_id}-colour-0" for r in lines)


def _work_units(gateway: GatewayProcess) -> float:
    """Work units the gateway has counted to its callers (all of them)."""
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    lines = [
        ln for ln in text.splitlines() if ln.startswith("vision_gateway_caller_work_units_total")
    ]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_the_whole_tree_is_charged_to_the_caller(channel, gateway):
    image = scenes.encode(_scene().pixels, "PNG")
    before = _work_units(gateway)
    pb_grpc.DetectionServiceStub(channel).Detect(
        pb.DetectRequest(image=image, model=pb.ModelSpec(name="detector"), min_score=0.5),
        timeout=120,
    )
    detect = _work_units(gateway) - before
    answer = ppb_grpc.PipelineServiceStub(channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120
    )
    tree = _work_units(gateway) - before - detect
    crops = sum(
        (s.crop.x_max - s.crop.x_min) * (s.crop.y_max - s.crop.y_min) / 1e6
        for instance in answer.instances
        for s in instance.steps.values()
    )
    # The picture decoded for the crops, the first model's image (as Detect's), each crop.
    assert tree >= detect + 640 * 480 / 1e6 + crops - 1e-6


def test_a_caller_cannot_make_a_pipeline_cut_more_than_its_model_allows(channel):
    stub = ppb_grpc.PipelineServiceStub(channel)
    image = scenes.encode(_scene().pixels, "PNG")
    with pytest.raises(grpc.RpcError) as refused:
        stub.Run(ppb.RunRequest(image=image, pipeline=PIPELINE, max_detections=100_000),
                 timeout=60)  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_detections" in refused.value.details()


def _batch_metric(gateway: GatewayProcess, suffix: str) -> float:
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    name = f'vision_gateway_upstream_batch_size_{suffix}{{model="classifier_scores"}}'
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name))


def test_the_crops_of_two_requests_share_predict_calls(channel, gateway):
    image = scenes.encode(_scene().pixels, "PNG")
    stub = ppb_grpc.PipelineServiceStub(channel)
    calls, crops = _batch_metric(gateway, "count"), _batch_metric(gateway, "sum")
    futures = [
        stub.Run.future(ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120)
        for _ in range(2)
    ]
    answered = sum(future.result().steps[0].crops for future in futures)
    calls, crops = _batch_metric(gateway, "count") - calls, _batch_metric(gateway, "sum") - crops
    assert crops == answered == 12
    # A request's crops run together, so those waiting while a call is out go as one batch.
    assert calls < crops / 2, (calls, crops)  # 20 of 20 runs in a row, 2 cores under load
