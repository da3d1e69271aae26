"""A task added without touching the core, the doors, the client or the runner
(docs/adding-a-task.md): the embedding task of tests/support/embedding, plugged in through the
task registry and the bindings the app takes, served end to end by the gRPC and HTTP doors in
front of the local TF Serving.

Its model is the reference `classifier_scores`, whose float [1, 8] output is the share of
the image's pixels nearest to each palette colour: for an image made of palette colours the
embedding is known exactly (the shares, normalised).
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from PIL import Image

from gateway import app
from gateway.api import bindings as api
from gateway.client import TaskClient
from gateway.client.cli import main as client_main
from gateway.config import Settings
from gateway.flags import parse_settings
from gateway.tasks.base import TaskRegistry
from serving.reference import CLASSIFIER_PALETTE, read_labels
from tests.support.embedding.binding import compile_messages, embedding_binding
from tests.support.embedding.task import EmbeddingTask
from tests.support.localserver import reserve_port, run_local_server

LABELS = read_labels()
MODEL = "classifier_scores"
SIDE = 224  # the model's input size: the image reaches it unresized, its shares exact
MODEL_CONFIG = f"""
default_model = "{MODEL}"
[models.{MODEL}]
task = "embedding"
[models.{MODEL}.input]
scale = 0.00392156862745098
"""


def stripes(*shares: tuple[str, int]) -> bytes:
    """A SIDE x SIDE PNG of vertical stripes: (palette colour, columns) from the left."""
    pixels = np.zeros((SIDE, SIDE, 3), np.uint8)
    left = 0
    for colour, columns in shares:
        pixels[:, left : left + columns] = CLASSIFIER_PALETTE[colour]
        left += columns
    assert left == SIDE
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def expected(*shares: tuple[str, int], dimensions: int = 0) -> np.ndarray:
    vector = np.zeros(len(LABELS))
    for colour, columns in shares:
        vector[LABELS.index(colour)] = columns / SIDE
    if dimensions:
        vector = vector[:dimensions]
    return vector / np.linalg.norm(vector)


IMAGE = ((LABELS[0], 168), (LABELS[1], 56))  # 3/4 and 1/4 of the first two classes


@dataclass
class Served:
    target: str
    http_url: str
    bindings: api.Bindings


@pytest.fixture(scope="module")
def served(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("added-task")
    serving_config = root / "models.config"
    serving_config.write_text(
        f"model_config_list {{ config {{ name: '{MODEL}' base_path: '{model_repo / MODEL}' "
        "model_platform: 'tensorflow' } }\n"
    )
    gateway_config = root / "gateway-models.toml"
    gateway_config.write_text(MODEL_CONFIG)
    tasks = TaskRegistry(
        [*app.built_in_tasks().values(), EmbeddingTask(embedding_binding(compile_messages(root)))]
    )
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
        with _gateway_thread(settings, tasks) as gateway:
            yield Served(
                f"127.0.0.1:{gateway.grpc_port}",
                f"http://127.0.0.1:{gateway.http_port}",
                bindings,
            )


class _gateway_thread:
    """The app started in its own event loop on a thread; stopped (drained) on exit."""

    def __init__(self, settings: Settings, tasks: TaskRegistry) -> None:
        self._args = (settings, tasks)
        self._started: Future[app.Gateway] = Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        settings, tasks = self._args
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            gateway = await app.start(settings, tasks=tasks)
        except BaseException as exc:
            self._started.set_exception(exc)
            raise
        self._started.set_result(gateway)
        await self._stop.wait()
        await gateway.stop()

    def __enter__(self) -> app.Gateway:
        self._thread.start()
        return self._started.result(timeout=120)

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()


def test_the_added_task_answers_over_grpc(served: Served) -> None:
    binding = served.bindings.for_verb("embed")
    with TaskClient(served.target, binding) as client:
        result = client.call(stripes(*IMAGE), model=MODEL)
        assert (result.image_width, result.image_height) == (SIDE, SIDE)
        assert result.model.name == MODEL and result.model.version == 1
        np.testing.assert_allclose(result.embedding, expected(*IMAGE), atol=1e-6)
        truncated = client.call(stripes(*IMAGE), model=MODEL, dimensions=1)
        np.testing.assert_allclose(truncated.embedding, [1.0], atol=1e-6)
        with pytest.raises(grpc.RpcError) as refused:
            client.call(stripes(*IMAGE), model=MODEL, dimensions=-1)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "dimensions must be >= 0" in (refused.value.details() or "")


def test_the_added_task_streams_with_per_image_errors(served: Served) -> None:
    binding = served.bindings.for_verb("embed")
    other = ((LABELS[2], SIDE),)
    with TaskClient(served.target, binding) as client:
        results = list(
            client.stream([stripes(*IMAGE), b"not an image", stripes(*other)], model=MODEL)
        )
    assert [r.HasField("error") for r in results] == [False, True, False]
    assert results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    np.testing.assert_allclose(results[0].embedding, expected(*IMAGE), atol=1e-6)
    np.testing.assert_allclose(results[2].embedding, expected(*other), atol=1e-6)


def test_the_added_task_has_its_http_route_and_openapi(served: Served) -> None:
    def post(path: str) -> dict:
        request = urllib.request.Request(
            served.http_url + path,
            data=stripes(*IMAGE),
            headers={"Content-Type": "image/png"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    routed = post(f"/v1/models/{MODEL}/versions/1:embed?dimensions=2")
    np.testing.assert_allclose(routed["embedding"], expected(*IMAGE, dimensions=2), atol=1e-6)
    # /invocations runs the default model's task, whatever it is.
    invoked = post("/invocations")
    np.testing.assert_allclose(invoked["embedding"], expected(*IMAGE), atol=1e-6)
    with urllib.request.urlopen(served.http_url + "/openapi.json", timeout=60) as response:
        document = json.loads(response.read())
    assert "/v1/models/{model}:embed" in document["paths"]
    assert document["components"]["schemas"]["EmbeddingResult"]["properties"]["embedding"] == {
        "type": "array",
        "items": {"type": "number"},
    }


def test_the_added_task_is_in_reflection_and_the_client_command(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with grpc.insecure_channel(served.target) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "embedding.v1.EmbeddingService" in services
    image = tmp_path / "stripes.png"
    image.write_bytes(stripes(*IMAGE))
    argv = [str(image), f"--target={served.target}", "--task=embed", "--dimensions=1"]
    assert client_main(argv, bindings=served.bindings) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["embedding"] == [1.0]
