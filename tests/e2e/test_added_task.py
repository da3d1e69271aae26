"""A gateway serves exactly the tasks it is given (docs/adding-a-task.md): the app takes a
task registry, and the doors, OpenAPI, reflection and the client command loop over its
tasks' bindings. Here the registry holds the embedding task alone (gateway/tasks/embedding,
a built-in task registered by one line of gateway/tasks/builtin.py, given here as a value):
it is served end to end in front of the local TF Serving, and the tasks it was not given are
nowhere. tests/e2e/test_embedding.py tests the task itself through the built-in gateway.

Its model is the reference `classifier_scores`, whose float [1, 8] output is the share of
the image's pixels nearest to each palette colour: for an image made of palette colours the
embedding is known exactly (the shares, normalised).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from gateway.api import bindings as api
from gateway.api.task import TaskRegistry
from gateway.client import TaskClient
from gateway.client.cli import main as client_main
from gateway.flags import parse_settings
from gateway.tasks import embedding
from tests.support.appthread import GatewayThread
from tests.support.localserver import reserve_port, run_local_server
from tests.support.stripes import IMAGE, SIDE, shares, stripes, unit

MODEL = "classifier_scores"
MODEL_CONFIG = f"""
default_model = "{MODEL}"
[models.{MODEL}]
task = "embedding"
[models.{MODEL}.input]
scale = 0.00392156862745098
"""


@dataclass
class Served:
    target: str
    http_url: str
    bindings: api.Bindings


@pytest.fixture(scope="module")
def served(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("given-tasks")
    serving_config = root / "models.config"
    serving_config.write_text(
        f"model_config_list {{ config {{ name: '{MODEL}' base_path: '{model_repo / MODEL}' "
        "model_platform: 'tensorflow' } }\n"
    )
    gateway_config = root / "gateway-models.toml"
    gateway_config.write_text(MODEL_CONFIG)
    tasks = TaskRegistry([embedding.TASK])
    bindings = tasks.bindings
    # The HTTP door's port 0 turns it off: a port held for it (it binds with SO_REUSEPORT).
    with run_local_server([f"--model_config_file={serving_config}"]) as tfs, reserve_port() as http:
        settings = parse_settings(
            [
                f"--upstream={tfs.target}",
                f"--model-config={gateway_config}",
                "--host=127.0.0.1",
                "--port=0",
                f"--http-port={http}",
                "--metrics-port=0",
                f"--job-store={root / 'jobs'}",
                "--batch-allow-anonymous=true",
            ],
            environ={},
        )
        with GatewayThread(settings, tasks) as gateway:
            yield Served(
                f"127.0.0.1:{gateway.grpc_port}",
                f"http://127.0.0.1:{gateway.http_port}",
                bindings,
            )


def test_the_given_task_answers_over_grpc_and_http(served: Served) -> None:
    binding = served.bindings.for_verb("embed")
    with TaskClient(served.target, binding) as client:
        result = client.call(stripes(*IMAGE), model=MODEL)
    assert (result.image_width, result.image_height) == (SIDE, SIDE)
    np.testing.assert_allclose(result.embedding, unit(shares(*IMAGE)), atol=1e-6)
    request = urllib.request.Request(
        served.http_url + "/invocations",
        data=stripes(*IMAGE),
        headers={"Content-Type": "image/png"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        invoked = json.loads(response.read())
    np.testing.assert_allclose(invoked["embedding"], unit(shares(*IMAGE)), atol=1e-6)


def test_the_tasks_not_given_are_nowhere(served: Served) -> None:
    with grpc.insecure_channel(served.target) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert "embedding.v1.EmbeddingService" in services
    assert not services & {
        "detection.v1.DetectionService",
        "classification.v1.ClassificationService",
    }
    with urllib.request.urlopen(served.http_url + "/openapi.json", timeout=60) as response:
        paths = set(json.loads(response.read())["paths"])
    assert "/v1/models/{model}:embed" in paths
    assert not [p for p in paths if p.endswith((":detect", ":classify"))]
    request = urllib.request.Request(
        served.http_url + f"/v1/models/{MODEL}:detect",
        data=stripes(*IMAGE),
        headers={"Content-Type": "image/png"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 404


def test_the_client_command_offers_the_given_tasks(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = tmp_path / "stripes.png"
    image.write_bytes(stripes(*IMAGE))
    argv = [str(image), f"--target={served.target}", "--task=embed", "--dimensions=1"]
    assert client_main(argv, bindings=served.bindings) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["embedding"] == [1.0]
    with pytest.raises(SystemExit):
        client_main([str(image), f"--target={served.target}", "--task=detect"],
                    bindings=served.bindings)  # fmt: skip
