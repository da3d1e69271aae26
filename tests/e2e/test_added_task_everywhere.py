"""A task the built-in ones lack goes everywhere a task goes once it is given: the Python
HTTP client and the client command over HTTP, check-models' trial, detection-batch and a
batch job over the API with its options. None of them may reach for the built-in tasks.

The added task is the embedding task under another name and verb ("vectors", `:vectorize`),
given to a gateway as its only task, as tests/e2e/test_added_task.py gives one; its model is
the reference `classifier_scores`, whose float [1, 8] output is the share of the image's
pixels nearest to each palette colour (the embedding is known exactly).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from gateway import modelcheck
from gateway.api import bindings as api
from gateway.api.task import TaskRegistry
from gateway.app import load_models
from gateway.client.cli import main as client_main
from gateway.client.http_client import HttpClient
from gateway.config import Settings
from gateway.flags import parse_settings
from gateway.jobs.runner.__main__ import main as batch_main
from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.builtin import BUILT_IN
from gateway.tasks.embedding import EmbeddingTask
from tests.support.appthread import GatewayThread
from tests.support.jobs import Client, State, metadata, options
from tests.support.localserver import reserve_port, run_local_server
from tests.support.stripes import IMAGE, OTHER, shares, stripes, unit

MODEL = "classifier_scores"
MODEL_CONFIG = f"""
default_model = "{MODEL}"
[models.{MODEL}]
task = "vectors"
[models.{MODEL}.input]
scale = 0.00392156862745098
"""


class VectorTask(EmbeddingTask):
    """The embedding task under a name and verb no built-in task has."""

    name = "vectors"
    binding = dataclasses.replace(EmbeddingTask.binding, task="vectors", verb="vectorize")


@dataclasses.dataclass
class Served:
    target: str
    http_url: str
    settings: Settings
    tasks: TaskRegistry
    root: Path

    @property
    def bindings(self) -> api.Bindings:
        return self.tasks.bindings


@pytest.fixture(scope="module")
def served(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("added-task")
    serving_config = root / "models.config"
    serving_config.write_text(
        f"model_config_list {{ config {{ name: '{MODEL}' base_path: '{model_repo / MODEL}' "
        "model_platform: 'tensorflow' } }\n"
    )
    (root / "gateway-models.toml").write_text(MODEL_CONFIG)
    images = root / "images"
    images.mkdir()
    (images / "a.png").write_bytes(stripes(*IMAGE))
    (images / "b.png").write_bytes(stripes(*OTHER))
    tasks = TaskRegistry([VectorTask()])
    assert "vectorize" not in BUILT_IN.verbs
    with run_local_server([f"--model_config_file={serving_config}"]) as tfs, reserve_port() as http:
        settings = parse_settings(
            [
                f"--upstream={tfs.target}",
                f"--model-config={root / 'gateway-models.toml'}",
                "--host=127.0.0.1",
                "--port=0",
                f"--http-port={http}",
                "--metrics-port=0",
                f"--job-store={root / 'jobs'}",
                f"--batch-allowed-input-uris={images}",
                "--batch-allow-anonymous=true",
            ],
            environ={},
        )
        with GatewayThread(settings, tasks) as gateway:
            target = f"127.0.0.1:{gateway.grpc_port}"
            yield Served(target, f"http://127.0.0.1:{gateway.http_port}", settings, tasks, root)


def test_the_http_client_calls_the_given_task(served: Served) -> None:
    client = HttpClient(served.http_url, task="vectorize", bindings=served.bindings)
    result = client.call(stripes(*IMAGE), model=MODEL)
    assert isinstance(result, epb.EmbeddingResult)
    np.testing.assert_allclose(result.embedding, unit(shares(*IMAGE)), atol=1e-6)
    assert len(client.call(stripes(*IMAGE), model=MODEL, dimensions=2).embedding) == 2
    with pytest.raises(ValueError, match="task must be one of vectorize"):
        HttpClient(served.http_url, task="embed", bindings=served.bindings)


def test_the_client_command_over_http_calls_the_given_task(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = tmp_path / "stripes.png"
    image.write_bytes(stripes(*IMAGE))
    argv = [str(image), f"--http={served.http_url}", "--task=vectorize", f"--model={MODEL}"]
    assert client_main([*argv, "--dimensions=1"], bindings=served.bindings) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["embedding"] == [1.0]


def test_check_models_tries_the_given_task(served: Served) -> None:
    registry = load_models(served.settings, served.tasks)
    reports, _ = asyncio.run(modelcheck.check(served.settings, registry, served.tasks))
    (report,) = reports
    assert (report.model, report.task, report.ok) == (MODEL, "vectors", True), report.error
    assert report.trial is not None and report.trial["summary"], report


def test_detection_batch_runs_the_given_task(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = [str(served.root / "images"), str(out), f"--target={served.target}"]
    assert batch_main([*argv, "--task=vectorize", "--dimensions=3"], served.bindings) == 0
    lines = [
        json.loads(line)
        for path in sorted(out.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert [line["id"] for line in lines] == ["a.png", "b.png"]
    for line, stripe in zip(lines, (IMAGE, OTHER), strict=True):
        want = unit(shares(*stripe)[:3])
        np.testing.assert_allclose(line["result"]["embedding"], want, atol=1e-6)
    # A value the task refuses: the gateway's task says so before any image is read.
    assert batch_main([*argv, "--task=vectorize", "--dimensions=-1"], served.bindings) == 2
    assert "dimensions must be in [0," in capsys.readouterr().err


def test_a_batch_job_over_the_api_runs_the_given_task(served: Served) -> None:
    with grpc.insecure_channel(served.target) as channel:
        client = Client(channel)
        op = client.create(
            input_uri=str(served.root / "images"),
            task="vectorize",
            model=model_pb2.ModelSpec(name=MODEL),
            options=options(epb.EmbedRequest(dimensions=8)),
        )
        done = client.wait(op.name)
        assert metadata(done).state == State.SUCCEEDED, done.error
        found = []
        for line in client.lines(op.name):
            result = epb.EmbeddingResult()
            assert line.result.Unpack(result)
            found.append(json_format.MessageToDict(result)["embedding"])
        for vector, stripe in zip(found, (IMAGE, OTHER), strict=True):
            np.testing.assert_allclose(vector, unit(shares(*stripe)), atol=1e-6)
        error = None
        try:
            client.create(input_uri=str(served.root / "images"), task="embed")
        except grpc.RpcError as e:
            error = e
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "task must be one of vectorize" in (error.details() or "")
