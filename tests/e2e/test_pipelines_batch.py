"""Pipelines over datasets (docs/pipelines.md "Over a dataset"): `detection-batch --pipeline`
against a gateway, and batch jobs naming a `pipeline` over both doors; each line's result is
the pipeline's own answer for that image, in input order. On the reference models
(tests/support/pipelinesetup.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from gateway.api import protojson
from gateway.proto.pipeline.v1 import pipeline_pb2 as ppb
from gateway.proto.pipeline.v1 import pipeline_pb2_grpc as ppb_grpc
from tests.support import jobs, jobshttp
from tests.support.answers import same
from tests.support.browser import job_view, with_page
from tests.support.gatewayproc import GatewayProcess
from tests.support.pipelinesetup import DATASET_SEEDS, PIPELINE, ROOT

MIN_SCORE = 0.6


def _answers(channel: grpc.Channel, images: Path) -> list[dict]:
    """The pipeline's answer (proto3 JSON) for each image of the dataset, in name order."""
    stub = ppb_grpc.PipelineServiceStub(channel)
    answers = []
    for path in sorted(images.iterdir()):
        request = ppb.RunRequest(image=path.read_bytes(), pipeline=PIPELINE, min_score=MIN_SCORE)
        answers.append(protojson.to_dict(stub.Run(request, timeout=120)))
    return answers


def _batch(gateway: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.jobs.runner", *args, f"--target={gateway.target}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def test_detection_batch_runs_a_pipeline_over_a_dataset(
    pipeline_gateway, pipeline_channel, pipeline_images, tmp_path
):
    out = tmp_path / "out"
    done = _batch(pipeline_gateway, str(pipeline_images), str(out), f"--pipeline={PIPELINE}",
                  f"--min-score={MIN_SCORE}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [
        json.loads(line) for line in (out / "results-00000-of-00001.jsonl").read_text().splitlines()
    ]
    assert [line["source"].rsplit("/", 1)[1] for line in lines] == [
        f"scene-{seed}.png" for seed in DATASET_SEEDS
    ]
    wanted = _answers(pipeline_channel, pipeline_images)
    for line, want in zip(lines, wanted, strict=True):
        same(line["result"], want, line["source"])
        assert line["result"]["pipeline"] == PIPELINE
        assert line["result"]["instances"][0]["steps"]["colour"]["classes"]["classes"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "pipeline" and summary["requested_model"]["name"] == PIPELINE
    # A pipeline's answers are counted under the model that found their instances.
    assert summary["served_by"] == [{"model": "detector", "version": 1, "images": 3}]


def test_detection_batch_refuses_a_pipeline_with_a_model_and_stops_at_an_unknown_one(
    pipeline_gateway, pipeline_images, tmp_path
):
    both = _batch(pipeline_gateway, str(pipeline_images), str(tmp_path / "a"),
                  f"--pipeline={PIPELINE}", "--model=detector")  # fmt: skip
    assert both.returncode == 2
    assert "--model cannot go with --pipeline: the pipeline's config names its models" in (
        both.stderr
    )
    options = _batch(pipeline_gateway, str(pipeline_images), str(tmp_path / "b"),
                     f"--pipeline={PIPELINE}", "--option=top_k=3")  # fmt: skip
    assert options.returncode == 2
    assert "top_k is not an option of task pipeline (its options: min_score, max_detections)" in (
        options.stderr
    )
    unknown = _batch(pipeline_gateway, str(pipeline_images), str(tmp_path / "c"),
                     "--pipeline=no_such_pipeline", "--give-up-after=30")  # fmt: skip
    assert unknown.returncode == 1, unknown.stderr
    assert "NOT_FOUND: the gateway has no pipeline named 'no_such_pipeline'" in unknown.stderr
    range_ = _batch(pipeline_gateway, str(pipeline_images), str(tmp_path / "d"),
                    f"--pipeline={PIPELINE}", "--min-score=2")  # fmt: skip
    assert range_.returncode == 2
    assert "the gateway refused the options" in range_.stderr and "min_score" in range_.stderr


def test_a_job_runs_a_pipeline_over_grpc(pipeline_channel, pipeline_images):
    client = jobs.Client(pipeline_channel)
    op = client.create(
        input_uri=str(pipeline_images), pipeline=PIPELINE,
        options=jobs.options(ppb.RunRequest(min_score=MIN_SCORE)),
    )  # fmt: skip
    done = client.wait(op.name)
    assert not done.HasField("error"), done.error
    assert jobs.result(done).code_counts == {"OK": 3}
    lines = client.lines(op.name)
    wanted = _answers(pipeline_channel, pipeline_images)
    for line, want in zip(lines, wanted, strict=True):
        result = ppb.PipelineResult()
        assert line.result.Unpack(result), line.result.type_url
        same(protojson.to_dict(result), want, line.source)


def test_a_job_runs_a_pipeline_over_http(pipeline_gateway, pipeline_channel, pipeline_images):
    body = {"input_uri": str(pipeline_images), "pipeline": PIPELINE,
            "options": {"min_score": MIN_SCORE}}  # fmt: skip
    op = jobshttp.ok(jobshttp.post_json(pipeline_gateway, "/v1/batchJobs", body))
    done = jobshttp.wait_done(pipeline_gateway, op["name"])
    assert "error" not in done, done
    status, _, text = jobshttp.curl(f"{pipeline_gateway.http_url}/v1/{op['name']}/results")
    assert status == 200, text
    lines = jobshttp.ndjson(text)
    wanted = _answers(pipeline_channel, pipeline_images)
    for line, want in zip(lines, wanted, strict=True):
        result = line["result"]
        assert result.pop("@type") == "type.googleapis.com/pipeline.v1.PipelineResult"
        same(result, want, line["source"])


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"task": "detect"}, "INVALID_ARGUMENT",
         "task 'detect' and pipeline 'detect_then_classify' are both set"),
        ({"model": {"name": "detector"}}, "INVALID_ARGUMENT",
         "model and pipeline 'detect_then_classify' are both set"),
        ({"options": {"top_k": 3}}, "INVALID_ARGUMENT",
         "options.top_k is not an option of task pipeline (its options: min_score, "
         "max_detections)"),
        ({"options": {"pipeline": "x"}}, "INVALID_ARGUMENT",
         "options sets pipeline: a job's options are the task's options only"),
        ({"options": {"min_score": 2}}, "INVALID_ARGUMENT", "min_score"),
        ({"pipeline": "p" * 200}, "INVALID_ARGUMENT",
         "pipeline is 200 characters; the limit is 128"),
        ({"pipeline": "no_such_pipeline"}, "NOT_FOUND",
         "the gateway has no pipeline named 'no_such_pipeline'; it has: detect_then_classify"),
        # A required step's model that cannot serve fails every image: refused at once.
        ({"pipeline": "missing_required"}, None, "no_such_model"),
    ],
)  # fmt: skip
def test_a_pipeline_job_is_refused_before_it_exists(
    pipeline_gateway, pipeline_images, fields, code, message
):
    body = {"input_uri": str(pipeline_images), "pipeline": PIPELINE, **fields}
    status, _, text = jobshttp.post_json(pipeline_gateway, "/v1/batchJobs", body)
    assert status >= 400, text
    error = json.loads(text)["error"]
    assert code is None or error["code"] == code, error
    assert message in error["message"], error


def test_an_optional_step_that_cannot_serve_fails_its_crops_not_the_job(
    pipeline_channel, pipeline_images
):
    client = jobs.Client(pipeline_channel)
    op = client.create(input_uri=str(pipeline_images), pipeline="missing_step")
    done = client.wait(op.name)
    assert jobs.result(done).code_counts == {"OK": 3}, done
    for line in client.lines(op.name):
        result = ppb.PipelineResult()
        line.result.Unpack(result)
        assert result.instances, line.source
        for instance in result.instances:
            assert instance.steps["colour"].error.code != 0, instance


def test_the_pages_jobs_view_runs_a_pipeline_job(
    pipeline_gateway, pipeline_channel, pipeline_images, browser
):
    url = f"{pipeline_gateway.http_url}/?pipeline={PIPELINE}&min_score={MIN_SCORE}"
    found = asyncio.run(
        with_page(browser, lambda page: job_view(page, url, [], str(pipeline_images)))
    )
    assert found["state"] == "done", found["status"]
    assert "SUCCEEDED" in found["status"] and "3 of 3 images" in found["status"]
    lines = jobshttp.ndjson(found["results"].encode())
    for line, want in zip(lines, _answers(pipeline_channel, pipeline_images), strict=True):
        result = line["result"]
        assert result.pop("@type") == "type.googleapis.com/pipeline.v1.PipelineResult"
        same(result, want, line["source"])
