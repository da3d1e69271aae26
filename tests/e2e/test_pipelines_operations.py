"""Pipelines as operators see them (docs/pipelines.md): check-models, the payload log, the
metrics and request log per step, the whole tree's cost to its caller, and crops batched
across requests; on the reference models (tests/support/pipelinesetup.py)."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from gateway.api import protojson
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.pipeline.v1 import pipeline_pb2 as ppb
from gateway.proto.pipeline.v1 import pipeline_pb2_grpc as ppb_grpc
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from tests.support.answers import same
from tests.support.gatewayproc import GatewayProcess
from tests.support.pipelinesetup import PIPELINE, ROOT, scene


def _check_models(upstream: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-models", f"--upstream={upstream}",
         f"--model-config={config}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def test_check_models_shows_each_pipeline_and_what_stops_one(reference_serving, pipeline_config):
    done = _check_models(reference_serving.target, pipeline_config)
    assert done.returncode == 1, done.stderr  # missing_step names a model TF Serving lacks
    out = done.stdout
    assert f"pipeline '{PIPELINE}': OK" in out
    assert "colour: model = classifier_scores, task = classification" in out
    assert "pipeline 'missing_step': CANNOT BE SERVED" in out
    assert "reason: its models no_such_model cannot be served" in out
    assert "2 of 4 pipelines can be served; not: missing_step, missing_required" in out


def test_check_models_refuses_a_pipeline_its_tasks_cannot_run(
    reference_serving, tmp_path, pipeline_config
):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        pipeline_config.read_text()
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


def test_the_payload_log_holds_one_event_with_the_whole_tree(pipeline_channel, pipeline_gateway):
    image = scenes.encode(scene().pixels, "PNG")
    answer = ppb_grpc.PipelineServiceStub(pipeline_channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE, request_id="logged-tree", min_score=0.6),
        timeout=120,
    )
    log = pipeline_gateway.log_path.parent / "payloads.jsonl"
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


def _events(pipeline_gateway: GatewayProcess, prefix: str, count: int) -> list[dict]:
    """The payload log's events of the calls whose request id starts with `prefix`, once
    there are `count` (the log is written by a thread of its own, after the answer)."""
    log = pipeline_gateway.log_path.parent / "payloads.jsonl"
    deadline = time.monotonic() + 60
    while True:
        events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        mine = [e for e in events if e["requestid"].startswith(prefix)]
        if len(mine) >= count or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


def test_logged_pipeline_calls_replay_through_detection_batch_to_the_same_trees(
    pipeline_channel, pipeline_gateway, tmp_path
):
    images = tmp_path / "images"  # the log holds hashes: replay finds each image by its own
    images.mkdir()
    stub = ppb_grpc.PipelineServiceStub(pipeline_channel)
    for seed in (3, 4):
        image = scenes.encode(scene(seed).pixels, "PNG")
        (images / f"{hashlib.sha256(image).hexdigest()}.png").write_bytes(image)
        request = ppb.RunRequest(image=image, pipeline=PIPELINE, min_score=0.6,
                                 request_id=f"replayed-tree-{seed}")  # fmt: skip
        stub.Run(request, timeout=120)
    log = tmp_path / "payloads.jsonl"
    events = _events(pipeline_gateway, "replayed-tree-", 2)
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    out = tmp_path / "replay"
    replay = subprocess.run(
        [sys.executable, "-m", "gateway.paylog", "replay", str(log), str(out),
         f"--images={images}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    summary = json.loads((out / "replay.json").read_text())
    assert summary["skipped"] == []
    (group,) = summary["groups"]
    assert (group["task"], group["model"], group["records"]) == ("pipeline", PIPELINE, 2)
    command = [pipeline_gateway.target if a == "HOST:PORT" else a
               for a in shlex.split(group["command"])[1:]]  # fmt: skip
    assert command[command.index("--pipeline") + 1] == PIPELINE
    run = subprocess.run(
        [sys.executable, "-m", "gateway.jobs.runner", *command],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    name = Path(group["directory"]).name
    got = (out / "results" / name / "requests.jsonl.jsonl").read_text().splitlines()
    expected = (out / group["directory"] / "expected.jsonl").read_text().splitlines()
    for line, logged in zip(map(json.loads, got), map(json.loads, expected), strict=True):
        assert line["id"] == logged["id"] and logged["code"] == "OK"
        same(line["result"], logged["result"], line["id"])
        assert line["result"]["instances"], "a tree without instances proves little"


def test_each_step_is_counted_under_its_own_method(pipeline_channel, pipeline_gateway):
    image = scenes.encode(scene().pixels, "PNG")
    answer = ppb_grpc.PipelineServiceStub(pipeline_channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120
    )
    url = f"http://127.0.0.1:{pipeline_gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    step = f'method="Pipeline {PIPELINE}/colour"'
    requests = [line for line in text.splitlines() if line.startswith("vision_gateway_requests_")]
    counted = [line for line in requests if step in line and 'code="OK"' in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= answer.steps[0].crops
    # Each crop's request log line names it, under the call's request id.
    lines = [
        r for r in pipeline_gateway.records() if r.get("method") == f"Pipeline {PIPELINE}/colour"
    ]
    assert any(r["request_id"] == f"{answer.request_id}-colour-0" for r in lines)


def _work_units(pipeline_gateway: GatewayProcess) -> float:
    """Work units the gateway has counted to its callers (all of them)."""
    url = f"http://127.0.0.1:{pipeline_gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    lines = [
        ln for ln in text.splitlines() if ln.startswith("vision_gateway_caller_work_units_total")
    ]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_the_whole_tree_is_charged_to_the_caller(pipeline_channel, pipeline_gateway):
    image = scenes.encode(scene().pixels, "PNG")
    before = _work_units(pipeline_gateway)
    pb_grpc.DetectionServiceStub(pipeline_channel).Detect(
        pb.DetectRequest(image=image, model=model_pb2.ModelSpec(name="detector"), min_score=0.5),
        timeout=120,
    )
    detect = _work_units(pipeline_gateway) - before
    answer = ppb_grpc.PipelineServiceStub(pipeline_channel).Run(
        ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120
    )
    tree = _work_units(pipeline_gateway) - before - detect
    crops = sum(
        (s.crop.x_max - s.crop.x_min) * (s.crop.y_max - s.crop.y_min) / 1e6
        for instance in answer.instances
        for s in instance.steps.values()
    )
    # The picture decoded for the crops, the first model's image (as Detect's), each crop.
    assert tree >= detect + 640 * 480 / 1e6 + crops - 1e-6


def test_a_caller_cannot_make_a_pipeline_cut_more_than_its_model_allows(pipeline_channel):
    stub = ppb_grpc.PipelineServiceStub(pipeline_channel)
    image = scenes.encode(scene().pixels, "PNG")
    with pytest.raises(grpc.RpcError) as refused:
        stub.Run(ppb.RunRequest(image=image, pipeline=PIPELINE, max_detections=100_000),
                 timeout=60)  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_detections" in refused.value.details()


def _batch_metric(pipeline_gateway: GatewayProcess, suffix: str) -> float:
    url = f"http://127.0.0.1:{pipeline_gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    name = f'vision_gateway_upstream_batch_size_{suffix}{{model="classifier_scores"}}'
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name))


def test_the_crops_of_two_requests_share_predict_calls(pipeline_channel, pipeline_gateway):
    image = scenes.encode(scene().pixels, "PNG")
    stub = ppb_grpc.PipelineServiceStub(pipeline_channel)
    calls, crops = _batch_metric(pipeline_gateway, "count"), _batch_metric(pipeline_gateway, "sum")
    futures = [
        stub.Run.future(ppb.RunRequest(image=image, pipeline=PIPELINE), timeout=120)
        for _ in range(2)
    ]
    answered = sum(future.result().steps[0].crops for future in futures)
    calls, crops = (
        _batch_metric(pipeline_gateway, "count") - calls,
        _batch_metric(pipeline_gateway, "sum") - crops,
    )
    assert crops == answered == 12
    # A request's crops run together, so those waiting while a call is out go as one batch.
    assert calls < crops / 2, (calls, crops)  # 20 of 20 runs in a row, 2 cores under load
