"""The HTTP door encodes a large answer off the event loop (issue 42.4: an 8.5 MB polygon
answer built on the loop stalled `/ping` 20.9 s), and a small one inline.

The doors run in the test process (tests/support/doors.py) over an in-process TF Serving with
an embedder whose vector is large (DIMENSIONS floats: a message over INLINE_BYTES). The
encoder is held inside its work until the test has had `/ping` answered: if encoding took the
event loop, `/ping` could not be answered and the test fails on its timeout; it waits for
events, never for time.
"""

from __future__ import annotations

import io
import json
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from gateway.api.protojson import to_dict
from gateway.frontends.http import responses
from gateway.proto.embedding.v1 import embedding_pb2
from tests.support.doors import InProcessDoors
from tests.support.fakeserving import Arrays, FakeModel

DIMENSIONS = 40_000  # 160 KB of floats: over INLINE_BYTES
CONFIG = """\
default_model = "embedder"

[defaults]
embedding = "embedder"
classification = "colours"

[models.embedder]
task = "embedding"

[models.colours]
task = "classification"
labels = "colours.txt"
"""


def ramp(inputs: Arrays) -> dict[str, np.ndarray]:
    return {"embedding": np.linspace(1.0, 2.0, DIMENSIONS, dtype=np.float32)[None]}


def shares(inputs: Arrays) -> dict[str, np.ndarray]:
    return {"probabilities": np.array([[0.7, 0.2, 0.1]], np.float32)}


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 10, 10)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDoors]:
    directory: Path = tmp_path_factory.mktemp("encoding")
    (directory / "colours.txt").write_text("red\ngreen\nblue\n")
    (directory / "models.toml").write_text(CONFIG)
    pixels = {"input_tensor": (tf.uint8, [1, -1, -1, 3])}
    models = [
        FakeModel("embedder", pixels, {"embedding": (tf.float32, [1, DIMENSIONS])}, ramp),
        FakeModel("colours", pixels, {"probabilities": (tf.float32, [1, 3])}, shares),
    ]
    with InProcessDoors(models, model_config=str(directory / "models.toml")) as running:
        yield running


def post(doors: InProcessDoors, path: str, accept: str = "application/json") -> Any:
    request = urllib.request.Request(
        doors.http_url + path, data=png(), headers={"Content-Type": "image/png", "Accept": accept}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
    return msgpack.unpackb(body) if "msgpack" in accept else json.loads(body)


class HeldEncoder:
    """Wraps an encoding function: records the thread it runs in, then waits for `release`."""

    def __init__(self, encode: Any) -> None:
        self.encode = encode
        self.started = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []

    def __call__(self, *args: Any) -> bytes:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(60), "never released"
        return bytes(self.encode(*args))


@pytest.mark.parametrize(
    ("accept", "function"),
    [("application/json", "to_json"), ("application/msgpack", "to_msgpack")],
)
def test_a_large_answer_is_encoded_off_the_loop_while_ping_is_answered(
    doors: InProcessDoors, monkeypatch: pytest.MonkeyPatch, accept: str, function: str
) -> None:
    held = HeldEncoder(getattr(responses, function))
    monkeypatch.setattr(responses, function, held)
    with ThreadPoolExecutor(1) as caller:
        answer = caller.submit(post, doors, "/v1/models/embedder:embed", accept)
        try:
            assert held.started.wait(60), "the answer was never encoded"
            # The encoder holds its answer: the event loop must still serve /ping.
            with urllib.request.urlopen(doors.http_url + "/ping", timeout=20) as ping:
                assert ping.status == 200
        finally:
            held.release.set()
        body = answer.result(60)
    assert held.threads == ["http-encode_0"]  # the encoder's pool, not the loop's thread
    assert len(body["embedding"]) == DIMENSIONS


def test_a_small_answer_is_encoded_on_the_loop(
    doors: InProcessDoors, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldEncoder(responses.to_json)
    held.release.set()
    monkeypatch.setattr(responses, "to_json", held)
    body = post(doors, "/v1/models/colours:classify")
    assert held.threads == ["doors"]  # InProcessDoors' event loop thread
    assert body["classes"][0]["label"] == "red"


def test_encoding_an_element_at_a_time_gives_the_same_bytes() -> None:
    message = embedding_pb2.EmbeddingResult(dimension=3, request_id="r")
    message.embedding.extend([0.5, -1.25, 3e-8])
    data = to_dict(message)
    whole = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    assert responses.to_json(message) == responses.to_json(message, chunked=True) == whole
    assert responses.to_msgpack(message) == responses.to_msgpack(message, chunked=True)
    assert msgpack.unpackb(responses.to_msgpack(message)) == msgpack.unpackb(
        msgpack.packb(data, use_bin_type=True, use_single_float=True)
    )
