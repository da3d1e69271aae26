"""Every built-in task through every door (issue 44.4: one door matrix, parametrized over the
bindings, instead of a copy per task): `make run`'s reference models (serving/models.config,
the default model of each task in serving/gateway-models.toml) behind one gateway, and for each
binding gRPC health and reflection, the unary call, the stream with a bad image in the middle,
each HTTP body form, a model of another task refused on both doors, the client command over
both doors, detection-batch and OpenAPI. Each door's answer must be the gRPC answer (as the HTTP
door writes it, floats to float32 precision), so what a task's own tests prove of its answers
over gRPC (its own file in tests/e2e/) holds at every door; a new built-in task is in the matrix
by being in gateway/tasks/builtin.py."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest
from google.protobuf.message_factory import GetMessageClass

from gateway.api.bindings import Binding
from gateway.api.protojson import to_dict
from gateway.tasks.builtin import BUILT_IN
from serving import scenes
from tests.support import tools
from tests.support.answers import same
from tests.support.gatewayproc import SERVING, GatewayProcess, run_gateway
from tests.support.httpcalls import call, multipart, ok_status
from tests.support.localserver import LocalServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "serving" / "gateway-models.toml"
DEFAULTS: dict[str, str] = tomllib.loads(CONFIG.read_text())["defaults"]
PICTURE = scenes.encode(scenes.shapes_scene().pixels, "PNG")
BINDINGS = list(BUILT_IN)


def model_of(binding: Binding) -> str:
    return DEFAULTS[binding.task]


def other_model(binding: Binding) -> str:
    """The default model of another task."""
    return next(model for task, model in DEFAULTS.items() if task != binding.task)


@pytest.fixture(scope="module")
def gateway(
    reference_serving: LocalServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    log_dir = tmp_path_factory.mktemp("door-matrix")
    with run_gateway(
        reference_serving.target, [f"--model-config={CONFIG}"], log_dir, http=True
    ) as gw:
        yield gw


@pytest.fixture(scope="module")
def answers(gateway: GatewayProcess) -> dict[str, dict[str, Any]]:
    """Each task's gRPC answer to PICTURE from its default model, as the HTTP door writes it."""
    out = {}
    with gateway.channel() as channel:
        for binding in BINDINGS:
            result = unary(
                channel, binding, binding.request_type(image=PICTURE, model=spec(binding))
            )
            out[binding.verb] = to_dict(result)
    return out


def spec(binding: Binding, model: str | None = None) -> Any:
    """The request's ModelSpec (every task's request takes the shared one)."""
    field = binding.request_type.DESCRIPTOR.fields_by_name["model"]
    return GetMessageClass(field.message_type)(name=model or model_of(binding))


def unary(channel: grpc.Channel, binding: Binding, request: Any) -> Any:
    method = channel.unary_unary(
        f"/{binding.service.full_name}/{binding.unary}",
        request_serializer=binding.request_type.SerializeToString,
        response_deserializer=binding.result_type.FromString,
    )
    return method(request, timeout=120)


def found_something(answer: dict[str, Any]) -> bool:
    """The answer holds a result (a non-empty list: boxes, classes, instances, a vector)."""
    return any(isinstance(value, list) and value for value in answer.values())


@pytest.fixture(params=BINDINGS, ids=[b.verb for b in BINDINGS])
def binding(request: pytest.FixtureRequest) -> Binding:
    return request.param  # type: ignore[no-any-return]


def test_the_grpc_answer_holds_a_result(
    answers: dict[str, dict[str, Any]], binding: Binding
) -> None:
    answer = answers[binding.verb]
    assert found_something(answer), answer
    assert (answer["image_width"], answer["image_height"]) == (640, 480)
    assert answer["model"]["name"] == model_of(binding)


def test_health_and_reflection_name_the_service(gateway: GatewayProcess, binding: Binding) -> None:
    assert gateway.health(binding.service.full_name) == SERVING
    grpcurl = tools.binary("grpcurl", tools.GRPCURL_INSTALL)
    described = subprocess.run(
        [grpcurl, "-plaintext", gateway.target, "describe", binding.service.full_name],
        capture_output=True, timeout=60, check=True,
    ).stdout.decode()  # fmt: skip
    request = binding.request_type.DESCRIPTOR.full_name
    assert f"rpc {binding.unary} ( .{request} )" in described
    assert f"rpc {binding.stream} ( stream .{request} )" in described


def test_the_stream_answers_in_order_with_the_bad_image_its_own_error(
    gateway: GatewayProcess, answers: dict[str, dict[str, Any]], binding: Binding
) -> None:
    requests = [
        binding.request_type(image=image, model=spec(binding), request_id=request_id)
        for image, request_id in ((PICTURE, "a"), (b"not an image", "b"), (PICTURE, "c"))
    ]
    with gateway.channel() as channel:
        stream = channel.stream_stream(
            f"/{binding.service.full_name}/{binding.stream}",
            request_serializer=binding.request_type.SerializeToString,
            response_deserializer=binding.result_type.FromString,
        )
        results = [to_dict(result) for result in stream(iter(requests), timeout=120)]
    assert [result["request_id"] for result in results] == ["a", "b", "c"]
    assert results[1]["error"]["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    for result in (results[0], results[2]):
        same(result, answers[binding.verb], binding.verb)


def test_every_http_body_gives_the_grpc_answer(
    gateway: GatewayProcess, answers: dict[str, dict[str, Any]], binding: Binding
) -> None:
    want = answers[binding.verb]
    path = f"/v1/models/{model_of(binding)}:{binding.verb}"
    same(ok_status(call(gateway, path, PICTURE, "image/png")), want, "raw")
    body = json.dumps({"image": {"b64": base64.b64encode(PICTURE).decode()}}).encode()
    same(ok_status(call(gateway, path, body, "application/json")), want, "json")
    form, content_type = multipart({}, PICTURE, "picture.png")
    same(ok_status(call(gateway, path, form, content_type)), want, "multipart")
    status, headers, packed = call(gateway, path, msgpack.packb({"image": PICTURE}),
                                   "application/msgpack")  # fmt: skip
    assert status == 200, packed
    assert "msgpack" in headers["content-type"]
    from_msgpack = msgpack.unpackb(packed)
    assert from_msgpack.pop("metadata") == {}  # a MessagePack body's other keys, here none
    same(from_msgpack, want, "msgpack")
    spec_paths = ok_status(call(gateway, "/openapi.json"))["paths"]
    assert f"/v1/models/{{model}}:{binding.verb}" in spec_paths


def test_a_model_of_another_task_is_refused_naming_it(
    gateway: GatewayProcess, binding: Binding
) -> None:
    other = other_model(binding)
    with gateway.channel() as channel, pytest.raises(grpc.RpcError) as refused:
        unary(channel, binding, binding.request_type(image=PICTURE, model=spec(binding, other)))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"'{other}' is configured as" in (refused.value.details() or "")
    status, _, body = call(gateway, f"/v1/models/{other}:{binding.verb}", PICTURE, "image/png")
    assert status == 400, body
    assert f"'{other}' is configured as" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("door", ["grpc", "http"])
def test_the_client_command_prints_the_doors_answer(
    gateway: GatewayProcess,
    answers: dict[str, dict[str, Any]],
    binding: Binding,
    door: str,
    tmp_path: Path,
) -> None:
    picture = tmp_path / "picture.png"
    picture.write_bytes(PICTURE)
    where = f"--target={gateway.target}" if door == "grpc" else f"--http={gateway.http_url}"
    done = subprocess.run(
        [sys.executable, "-m", "gateway.client", str(picture), f"--task={binding.verb}", where,
         f"--model={model_of(binding)}"],
        capture_output=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    (line,) = done.stdout.decode().splitlines()
    printed = json.loads(line)
    assert printed.pop("image") == str(picture)
    same(printed, answers[binding.verb], door, tolerance=5e-5)


def test_detection_batch_writes_the_http_doors_answer_in_input_order(
    gateway: GatewayProcess, answers: dict[str, dict[str, Any]], binding: Binding, tmp_path: Path
) -> None:
    images = tmp_path / "dataset"
    images.mkdir()
    (images / "a.png").write_bytes(PICTURE)
    (images / "b.png").write_bytes(b"not an image")
    (images / "c.png").write_bytes(PICTURE)
    out = tmp_path / "batch-out"
    done = subprocess.run(
        [sys.executable, "-m", "gateway.jobs.runner", str(images), str(out),
         f"--target={gateway.target}", f"--task={binding.verb}", f"--model={model_of(binding)}"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (results,) = out.glob("results-*.jsonl")
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a.png", "b.png", "c.png"]
    assert lines[1]["error"]["code"] == "INVALID_ARGUMENT"
    for line in (lines[0], lines[2]):
        same(line["result"], answers[binding.verb], line["id"])
