"""Calls to the gateway's HTTP door for its tests (tests/frontends/http): a request with urllib
or the real `curl`, its JSON answer or its error, the same image through the gRPC door for
comparison, multipart bodies, and the scene every test sends (a 640x480 JPEG and PNG with known
boxes)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
import uuid
from typing import Any

import grpc
import msgpack
import numpy as np
from google.protobuf import json_format

from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.support import tools
from tests.support.gatewayproc import GatewayProcess

SCENE = scenes.generate_scene(np.random.default_rng(11), 640, 480, 6, noise_sigma=3.0)


JPEG = scenes.encode(SCENE.pixels, "JPEG")


PNG = scenes.encode(SCENE.pixels, "PNG")


Response = tuple[int, dict[str, str], bytes]


def call(
    gateway: GatewayProcess,
    path: str,
    body: bytes | None = None,
    content_type: str | None = None,
    method: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """One request with urllib; (status, headers with lower-case names, body)."""
    all_headers = dict(headers or {})
    if content_type is not None:
        all_headers["Content-Type"] = content_type
    request = urllib.request.Request(
        gateway.http_url + path, data=body, headers=all_headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, _lower(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, _lower(e.headers), e.read()


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def curl(gateway: GatewayProcess, path: str, *args: str) -> Response:
    """One request with the curl binary; (status, headers, body)."""
    binary = tools.binary("curl", tools.CURL_INSTALL)
    run = subprocess.run(
        [binary, "-sS", "-D", "-", "--max-time", "60", *args, gateway.http_url + path],
        capture_output=True,
        timeout=90,
        check=True,
    )
    head, _, body = run.stdout.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # curl's Expect: 100-continue
        head, _, body = body.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def ok_json(response: Response) -> dict[str, Any]:
    status, headers, body = response
    assert status == 200, body
    assert headers["content-type"].startswith("application/json")
    assert headers["x-request-id"]
    return dict(json.loads(body))


def error_of(response: Response, status: int, code: str, request_id: bool = True) -> str:
    """The error's message, after checking status, code and (for predictions) request id."""
    got, headers, body = response
    assert got == status, body
    if request_id:
        assert headers["x-request-id"]
    if headers["content-type"] == "application/x-msgpack":
        error = msgpack.unpackb(body)["error"]
    else:
        error = json.loads(body)["error"]
    assert error["code"] == code
    return str(error["message"])


def grpc_detect(channel: grpc.Channel, image: bytes, **fields: Any) -> dict[str, Any]:
    result = gateway_stub(channel).Detect(pb.DetectRequest(image=image, **fields), timeout=60)
    return comparable(
        json_format.MessageToDict(
            result, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    )


def gateway_stub(channel: grpc.Channel) -> Any:
    from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc

    return pb_grpc.DetectionServiceStub(channel)


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A result without its request id (different per call)."""
    return {k: v for k, v in result.items() if k != "request_id"}


def assert_scene(result: dict[str, Any]) -> None:
    """The painted rectangles, as the detector finds them (1 px tolerance)."""
    assert (result["image_width"], result["image_height"]) == (SCENE.width, SCENE.height)
    found = sorted(
        (d["class_id"], d["box"]["x_min"], d["box"]["y_min"], d["box"]["x_max"], d["box"]["y_max"])
        for d in result["detections"]
    )
    truth = sorted((b.class_id, b.x_min, b.y_min, b.x_max, b.y_max) for b in SCENE.boxes)
    assert len(found) == len(truth)
    for got, want in zip(found, truth, strict=True):
        assert got[0] == want[0]
        assert all(abs(a - b) <= 1 for a, b in zip(got[1:], want[1:], strict=True)), (got, want)


def multipart(
    fields: dict[str, str], image: bytes, filename: str = "scene.jpg"
) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{filename}"\r\n'
        "Content-Type: image/jpeg\r\n\r\n".encode()
        + image
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def ok_status(response: Response) -> Any:
    status, _, body = response
    assert status == 200, body
    return json.loads(body)
