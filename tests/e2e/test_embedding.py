"""Embeddings end to end: the built-in embedding task through a real gateway process in front
of the local TF Serving, over gRPC (the vector, its options and refusals), HTTP (JSON,
MessagePack, raw, multipart, /invocations, OpenAPI) and check-models. What every task does at
every door (stream, health, reflection, the client command, detection-batch, a model of
another task refused) is tests/e2e/test_door_matrix.py.

The model is the reference `classifier_scores`, served twice: its float [1, 8] output is the
share of the image's pixels nearest to each palette colour, so for an image made of palette
colours the vector is known exactly (the shares; normalised: divided by their L2 norm).
`embedder` takes the defaults (recognised output, L2); `embedder_raw` names its output and
says normalize = false; as `classifier_scores` it is a classifier.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgpack
import numpy as np
import pytest

from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.proto.embedding.v1 import embedding_pb2_grpc as epb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, run_local_server
from tests.support.stripes import IMAGE, LABELS, OTHER, SIDE, shares, stripes, unit

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = """
default_model = "embedder"
[models.embedder]
task = "embedding"
[models.embedder.input]
scale = 0.00392156862745098
[models.embedder_raw]
task = "embedding"
[models.embedder_raw.input]
scale = 0.00392156862745098
[models.embedder_raw.outputs]
embedding = "probabilities"
normalize = false
[models.classifier_scores]
task = "classification"
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Holds the gateway's model config and TF Serving's."""
    directory = tmp_path_factory.mktemp("embedding")
    (directory / "gateway-models.toml").write_text(MODEL_CONFIG)
    return directory


@pytest.fixture(scope="module")
def served(model_repo: Path, root: Path) -> Iterator[LocalServer]:
    base = model_repo / "classifier_scores"
    entries = "".join(
        f"config {{ name: '{name}' base_path: '{base}' model_platform: 'tensorflow' }}\n"
        for name in ("embedder", "embedder_raw", "classifier_scores")
    )
    (root / "models.config").write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={root / 'models.config'}"]) as tfs:
        yield tfs


@pytest.fixture(scope="module")
def gateway(served: LocalServer, root: Path) -> Iterator[GatewayProcess]:
    args = [f"--model-config={root / 'gateway-models.toml'}"]
    with run_gateway(served.target, args, log_dir=root, http=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def stub(gateway: GatewayProcess) -> Iterator[epb_grpc.EmbeddingServiceStub]:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield epb_grpc.EmbeddingServiceStub(channel)


def embed(stub: epb_grpc.EmbeddingServiceStub, image: bytes, **fields: Any) -> Any:
    model = fields.pop("model", "embedder")
    request = epb.EmbedRequest(image=image, model=model_pb2.ModelSpec(name=model), **fields)
    return stub.Embed(request, timeout=60)


def test_embed_gives_the_unit_length_vector(stub: epb_grpc.EmbeddingServiceStub) -> None:
    for fmt in ("PNG", "BMP"):  # lossless: the shares are exact
        result = embed(stub, stripes(*IMAGE, fmt=fmt), request_id="r1")
        assert (result.image_width, result.image_height) == (SIDE, SIDE)
        assert result.model.name == "embedder" and result.model.version == 1
        assert result.request_id == "r1"
        assert result.dimension == len(LABELS) == len(result.embedding)
        assert result.normalized
        np.testing.assert_allclose(result.embedding, unit(shares(*IMAGE)), atol=1e-6)


def test_the_embedding_is_packed_on_the_wire(stub: epb_grpc.EmbeddingServiceStub) -> None:
    result = embed(stub, stripes(*IMAGE))
    # field 1, wire type 2 (length-delimited): one packed run of 8 floats
    assert result.SerializeToString().startswith(b"\x0a\x20")


def test_normalize_false_keeps_the_models_values(stub: epb_grpc.EmbeddingServiceStub) -> None:
    result = embed(stub, stripes(*IMAGE), model="embedder_raw")
    assert not result.normalized and result.dimension == len(LABELS)
    np.testing.assert_allclose(result.embedding, shares(*IMAGE), atol=1e-6)
    truncated = embed(stub, stripes(*IMAGE), model="embedder_raw", dimensions=1)
    np.testing.assert_allclose(truncated.embedding, [0.75], atol=1e-6)


def test_dimensions_keeps_a_prefix_then_normalises(stub: epb_grpc.EmbeddingServiceStub) -> None:
    result = embed(stub, stripes(*IMAGE), dimensions=2)
    assert result.dimension == 2 and result.normalized
    np.testing.assert_allclose(result.embedding, unit(np.array([0.75, 0.25])), atol=1e-6)
    for dimensions, says in [
        (-1, "dimensions must be in [0, 65536]"),
        (9, "dimensions is 9 but model 'embedder' gives 8; ask for at most 8"),
    ]:
        with pytest.raises(grpc.RpcError) as refused:
            embed(stub, stripes(*IMAGE), dimensions=dimensions)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in (refused.value.details() or "")


def test_a_zero_vector_comes_back_unnormalised(stub: epb_grpc.EmbeddingServiceStub) -> None:
    # Only the first class: its leading prefix of one is 1, the second class's prefix 0.
    result = embed(stub, stripes(*OTHER), dimensions=2)
    assert not result.normalized and list(result.embedding) == [0.0, 0.0]


def post(
    gateway: GatewayProcess, path: str, body: bytes, content_type: str, accept: str = ""
) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
    request = urllib.request.Request(gateway.http_url + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def multipart(fields: dict[str, str], image: bytes) -> tuple[bytes, str]:
    boundary = "embedding-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
        "Content-Type: image/png\r\n\r\n".encode()
        + image
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def test_every_http_body_gives_the_vector_as_a_json_array(gateway: GatewayProcess) -> None:
    image = stripes(*IMAGE)
    want = unit(np.array([0.75, 0.25]))
    encoded = base64.b64encode(image).decode()
    bodies = {
        "raw": (image, "image/png", "?dimensions=2"),
        "json": (
            json.dumps({"image": {"b64": encoded}, "dimensions": 2}).encode(),
            "application/json",
            "",
        ),
        "msgpack": (msgpack.packb({"image": image, "dimensions": 2}), "application/msgpack", ""),
        "multipart": (*multipart({"dimensions": "2"}, image), ""),
    }
    for kind, (body, content_type, query) in bodies.items():
        status, raw = post(
            gateway, f"/v1/models/embedder/versions/1:embed{query}", body, content_type,
            accept="application/json",
        )  # fmt: skip
        assert status == 200, (kind, raw)
        result = json.loads(raw)
        assert result["dimension"] == 2 and result["normalized"] is True, kind
        assert isinstance(result["embedding"], list)
        np.testing.assert_allclose(result["embedding"], want, atol=1e-6, err_msg=kind)
        assert result["model"] == {"name": "embedder", "version": "1"}
        assert (result["image_width"], result["image_height"]) == (SIDE, SIDE)
    path = "/v1/models/embedder:embed"
    status, raw = post(gateway, path, image, "image/png", "application/msgpack")
    packed = msgpack.unpackb(raw)
    assert status == 200 and packed["dimension"] == 8
    np.testing.assert_allclose(packed["embedding"], unit(shares(*IMAGE)), atol=1e-6)


def test_http_refusals_name_the_option(gateway: GatewayProcess) -> None:
    status, raw = post(
        gateway, "/v1/models/embedder:embed?dimensions=9", stripes(*IMAGE), "image/png"
    )
    error = json.loads(raw)["error"]
    assert status == 400 and error["code"] == "INVALID_ARGUMENT"
    assert "ask for at most 8" in error["message"]


def test_invocations_runs_the_default_models_task(gateway: GatewayProcess) -> None:
    status, raw = post(gateway, "/invocations", stripes(*IMAGE), "image/png")
    assert status == 200
    np.testing.assert_allclose(json.loads(raw)["embedding"], unit(shares(*IMAGE)), atol=1e-6)


def test_openapi_describes_the_route_and_result(gateway: GatewayProcess) -> None:
    with urllib.request.urlopen(gateway.http_url + "/openapi.json", timeout=60) as response:
        document = json.loads(response.read())
    assert "/v1/models/{model}:embed" in document["paths"]
    properties = document["components"]["schemas"]["EmbeddingResult"]["properties"]
    assert properties["embedding"] == {"type": "array", "items": {"type": "number"}}
    assert properties["normalized"]["type"] == "boolean"
    assert properties["dimension"]["type"] == "integer"


def test_check_models_shows_the_plan_and_a_trial(served: LocalServer, root: Path) -> None:
    config = root / "gateway-models.toml"
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-models", "--json",
         f"--upstream={served.target}", f"--model-config={config}"],
        capture_output=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    reports = {r["model"]: r for r in json.loads(done.stdout)["models"]}
    recognised, named = reports["embedder"], reports["embedder_raw"]
    assert recognised["outputs"] == {
        "form": "embedding",
        "embedding": "probabilities",
        "found by": "the signature's only float [batch, dimension] output",
        "dimension": 8,
        "normalize": "L2",
    }
    assert named["outputs"]["found by"] == "model config"
    assert named["outputs"]["normalize"] == "no (the model's values)"
    assert recognised["trial"]["summary"] == {"dimension": 8, "normalized": True}
    assert len(recognised["trial"]["result"]["embedding"]) == 3  # the report's first values
