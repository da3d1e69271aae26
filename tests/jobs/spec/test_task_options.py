"""Batch jobs name their task by its verb and carry its options as the task's own request
message (CreateBatchJobRequest.options, a google.protobuf.Any; over HTTP also a plain
object), through both doors of one gateway process: classification with top_k and embedding
with dimensions come back as each image's result says they must; what a task does not know or
refuses is INVALID_ARGUMENT naming it, never dropped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.proto.vision.v1 import model_pb2
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, State, gateway, make_images, metadata, options, refused
from tests.support.jobshttp import curl, ndjson, ok, post_json, wait_done
from tests.support.jobshttp import refused as refused_http
from tests.support.localserver import LocalServer, run_local_server

IMAGES = 3
SERVING = Path(__file__).resolve().parents[3] / "serving"
# The reference classifier served a second time as an embedding model (its float [b, 8]
# output is the embedding), beside the detector and the classifier.
MODEL_CONFIG = f"""
default_model = "detector"
[models.detector]
task = "detection"
label_map = "{SERVING / "label_map.pbtxt"}"
[models.classifier_scores]
task = "classification"
labels = "{SERVING / "labels.txt"}"
[models.classifier_scores.input]
scale = 0.00392156862745098
[models.embedder]
task = "embedding"
[models.embedder.input]
scale = 0.00392156862745098
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("task-options")
    make_images(directory / "images", IMAGES)
    (directory / "gateway-models.toml").write_text(MODEL_CONFIG)
    return directory


@pytest.fixture(scope="module")
def served(model_repo: Path, root: Path) -> Iterator[LocalServer]:
    bases = {
        "detector": model_repo / "detector",
        "classifier_scores": model_repo / "classifier_scores",
        "embedder": model_repo / "classifier_scores",
    }
    entries = "".join(
        f"config {{ name: '{name}' base_path: '{base}' model_platform: 'tensorflow' }}\n"
        for name, base in bases.items()
    )
    (root / "models.config").write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={root / 'models.config'}"]) as tfs:
        yield tfs


@pytest.fixture(scope="module")
def gw(served: LocalServer, root: Path, module_store: Path) -> Iterator[GatewayProcess]:
    extra = [f"--model-config={root / 'gateway-models.toml'}"]
    with gateway(served, module_store, root, extra, http=True) as process:
        yield process


@pytest.fixture(scope="module")
def client(gw: GatewayProcess) -> Iterator[Client]:
    with gw.channel() as channel:
        yield Client(channel)


def grpc_results(client: Client, result_type: type, **fields: object) -> list:
    done = client.wait(client.create(**fields).name)
    assert metadata(done).state == State.SUCCEEDED, done.error
    found = []
    for line in client.lines(done.name):
        message = result_type()
        assert line.result.Unpack(message), line
        found.append(message)
    assert len(found) == IMAGES
    return found


def http_results(gw: GatewayProcess, request: dict) -> list[dict]:
    op = ok(post_json(gw, "/v1/batchJobs", request))
    done = wait_done(gw, op["name"])
    assert done["metadata"]["state"] == "SUCCEEDED", done
    status, _, body = curl(f"{gw.http_url}/v1/{op['name']}/results")
    assert status == 200, body
    lines = ndjson(body)
    assert len(lines) == IMAGES and all("result" in line for line in lines), lines
    return [line["result"] for line in lines]


def test_a_classification_job_over_grpc_keeps_top_k(client: Client, root: Path) -> None:
    source = str(root / "images")
    model = model_pb2.ModelSpec(name="classifier_scores")
    for top_k in (2, 5):
        found = grpc_results(
            client,
            cpb.ClassificationResult,
            input_uri=source,
            task="classify",
            model=model,
            options=options(cpb.ClassifyRequest(top_k=top_k)),
        )
        assert [len(r.classes) for r in found] == [top_k] * IMAGES


def test_an_embedding_job_over_grpc_keeps_its_dimensions(client: Client, root: Path) -> None:
    found = grpc_results(
        client,
        epb.EmbeddingResult,
        input_uri=str(root / "images"),
        task="embed",
        model=model_pb2.ModelSpec(name="embedder"),
        options=options(epb.EmbedRequest(dimensions=3)),
    )
    assert [(len(r.embedding), r.dimension) for r in found] == [(3, 3)] * IMAGES
    whole = grpc_results(
        client,
        epb.EmbeddingResult,
        input_uri=str(root / "images"),
        task="embed",
        model=model_pb2.ModelSpec(name="embedder"),
    )
    assert [len(r.embedding) for r in whole] == [8] * IMAGES
    for part, full in zip(found, whole, strict=True):
        assert list(part.embedding) == pytest.approx(list(full.embedding)[:3], abs=1e-6)


def test_jobs_over_http_take_the_options_as_a_plain_object(gw: GatewayProcess, root: Path) -> None:
    source = str(root / "images")
    classes = http_results(
        gw,
        {
            "input_uri": source,
            "task": "classify",
            "model": {"name": "classifier_scores"},
            "options": {"top_k": 2},
        },
    )
    assert [len(r["classes"]) for r in classes] == [2] * IMAGES
    assert all(r["@type"] == "type.googleapis.com/classification.v1.ClassificationResult"
               for r in classes)  # fmt: skip
    vectors = http_results(
        gw,
        {
            "input_uri": source,
            "task": "embed",
            "model": {"name": "embedder"},
            "options": {"dimensions": 4},
        },
    )
    assert [(len(r["embedding"]), r["dimension"]) for r in vectors] == [(4, 4)] * IMAGES
    # The proto3 JSON of an Any works as well.
    packed = http_results(
        gw,
        {
            "input_uri": source,
            "task": "classify",
            "model": {"name": "classifier_scores"},
            "options": {"@type": "type.googleapis.com/classification.v1.ClassifyRequest",
                        "topK": 1},
        },
    )  # fmt: skip
    assert [len(r["classes"]) for r in packed] == [1] * IMAGES


def test_http_refuses_an_option_the_task_does_not_have(gw: GatewayProcess, root: Path) -> None:
    base = {"input_uri": str(root / "images"), "model": {"name": "classifier_scores"}}
    message = refused_http(
        post_json(
            gw, "/v1/batchJobs", {**base, "task": "classify", "options": {"max_detections": 3}}
        ),
        400,
        "INVALID_ARGUMENT",
    )
    assert "options.max_detections is not an option of task classify" in message
    assert "top_k, min_score" in message or "min_score, top_k" in message
    message = refused_http(
        post_json(gw, "/v1/batchJobs", {**base, "task": "classify", "options": {"top_k": -1}}),
        400,
        "INVALID_ARGUMENT",
    )
    assert "top_k must be in [0," in message
    message = refused_http(
        post_json(gw, "/v1/batchJobs", {**base, "model": {}, "options": {"min_score": 2}}),
        400,
        "INVALID_ARGUMENT",
    )
    assert "min_score must be in [0, 1]" in message
    message = refused_http(
        post_json(gw, "/v1/batchJobs", {**base, "task": "classify", "options": {"image": "AAAA"}}),
        400,
        "INVALID_ARGUMENT",
    )
    assert "options sets image" in message
    message = refused_http(
        post_json(gw, "/v1/batchJobs", {**base, "task": "TASK_CLASSIFY"}), 400, "INVALID_ARGUMENT"
    )
    assert "task must be one of" in message and "classify" in message


def test_grpc_refuses_another_tasks_options_and_values_the_task_refuses(
    client: Client, root: Path
) -> None:
    fields = {
        "input_uri": str(root / "images"),
        "model": model_pb2.ModelSpec(name="classifier_scores"),
    }
    error = refused(
        client.create, task="classify", options=options(pb.DetectRequest(min_score=0.5)), **fields
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "options must be a classification.v1.ClassifyRequest for task classify" in (
        error.details() or ""
    )
    assert "got detection.v1.DetectRequest" in (error.details() or "")
    error = refused(
        client.create, task="classify", options=options(cpb.ClassifyRequest(min_score=2)), **fields
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_score must be in [0, 1]" in (error.details() or "")
    error = refused(
        client.create,
        task="embed",
        options=options(epb.EmbedRequest(dimensions=-1)),
        input_uri=fields["input_uri"],
        model=model_pb2.ModelSpec(name="embedder"),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dimensions must be in [0," in (error.details() or "")
