"""The HTTP door end to end when the request is wrong: malformed bodies, query and form errors,
unknown routes, methods and media types, and bodies over the limits (400, 404, 405, 413, 415,
each naming what to fix); the real `curl` with every body type, a 1 GB upload refused while it
streams, Expect: 100-continue, and the browser page.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import msgpack
import numpy as np
import pytest

from serving import scenes
from tests.frontends.http.conftest import MAX_IMAGE_BYTES
from tests.support import tools
from tests.support.httpcalls import (
    JPEG,
    call,
    comparable,
    curl,
    error_of,
    grpc_detect,
    multipart,
    ok_json,
    ok_status,
)

BAD_BODIES = [
    ("application/json", b"{", "not valid JSON"),
    ("application/json", b"[1, 2]", "must be an object"),
    ("application/json", b'{"min_score": 0.5}', "no 'image' field"),
    ("application/json", b'{"image": 12}', "image must be a base64 string"),
    ("application/json", b'{"image": "not base64!"}', "image is not valid base64"),
    ("application/json", b'{"image": {"b64": "AAAA", "x": 1}}', "image must be"),
    ("application/json", b'{"image": "AAAA", "min_score": "high"}', "min_score"),
    ("application/json", b'{"image": "AAAA", "max_detections": 1.5}', "max_detections"),
    ("application/json", b'{"image": "AAAA", "colour": 1}', "colour"),
    ("application/x-msgpack", b"\xc1", "MessagePack body must be a map"),
    ("application/x-msgpack", msgpack.packb([1, 2]), "must be a map"),
    ("application/x-msgpack", msgpack.packb({"camera": "x"}), "no 'image' entry"),
    ("application/x-msgpack", msgpack.packb({"image": "c3RyaW5n"}), "image is a MessagePack str"),
    (
        "application/x-msgpack",
        msgpack.packb({"image": b"x", "min_score": "0.5"}),
        "min_score must be a number",
    ),
    (
        "application/x-msgpack",
        msgpack.packb({"image": b"x", "max_detections": True}),
        "max_detections must be an integer",
    ),
    (
        "application/x-msgpack",
        msgpack.packb({"image": b"x", "model": "detector"}),
        "model must be a map",
    ),
    (
        "application/x-msgpack",
        msgpack.packb({"image": b"x", "model": {"nme": "d"}}),
        "model has no field 'nme'",
    ),
    ("application/x-msgpack", msgpack.packb({"image": b"x"}) + b"\x01", "after its map"),
    ("application/x-msgpack", msgpack.packb({"image": b"x"})[:-1], "not valid MessagePack"),
    ("image/jpeg", b"", "image is empty"),
    ("image/jpeg", b"not an image at all", "could not be decoded"),
]


@pytest.mark.parametrize(("content_type", "body", "named"), BAD_BODIES)
def test_malformed_bodies_are_400_naming_the_field(gateway, content_type, body, named) -> None:
    message = error_of(
        call(gateway, "/v1/models/detector:detect", body, content_type), 400, "INVALID_ARGUMENT"
    )
    assert named in message


def test_query_and_form_errors_are_400(gateway) -> None:
    assert "min_score must be a number" in error_of(
        call(gateway, "/v1/models/detector:detect?min_score=high", JPEG, "image/jpeg"),
        400,
        "INVALID_ARGUMENT",
    )
    assert "unknown query parameter 'minscore'" in error_of(
        call(gateway, "/v1/models/detector:detect?minscore=0.2", JPEG, "image/jpeg"),
        400,
        "INVALID_ARGUMENT",
    )
    assert "min_score must be in [0, 1]" in error_of(
        call(gateway, "/v1/models/detector:detect?min_score=1.5", JPEG, "image/jpeg"),
        400,
        "INVALID_ARGUMENT",
    )
    body, content_type = multipart({"min_score": "0.5"}, JPEG)
    no_image = body.replace(b'name="image"', b'name="picture"')
    assert "no 'image' part" in error_of(
        call(gateway, "/v1/models/detector:detect", no_image, content_type), 400, "INVALID_ARGUMENT"
    )
    body = json.dumps({"image": base64.b64encode(JPEG).decode(), "model": {"name": "other"}})
    assert "path names 'detector'" in error_of(
        call(gateway, "/v1/models/detector:detect", body.encode(), "application/json"),
        400,
        "INVALID_ARGUMENT",
    )


def test_unknown_model_route_method_and_media_type(gateway) -> None:
    assert "'nope'" in error_of(
        call(gateway, "/v1/models/nope:detect", JPEG, "image/jpeg"), 404, "NOT_FOUND"
    )
    assert "no route" in error_of(
        call(gateway, "/v2/anything", JPEG, "image/jpeg"), 404, "NOT_FOUND"
    )
    assert "no route" in error_of(
        call(gateway, "/v1/models/detector:transcribe", JPEG, "image/jpeg"), 404, "NOT_FOUND"
    )
    status, headers, body = call(gateway, "/v1/models/detector:detect")
    assert status == 405 and headers["allow"] == "POST"
    assert json.loads(body)["error"]["code"] == "UNIMPLEMENTED"
    status, headers, _ = call(gateway, "/ping", b"{}", "application/json")
    assert status == 405 and "GET" in headers["allow"]
    assert call(gateway, "/invocations", method="GET")[0] == 405
    message = error_of(
        call(gateway, "/v1/models/detector:detect", b"a,b", "text/csv"), 415, "INVALID_ARGUMENT"
    )
    for accepted in (
        "application/json",
        "application/x-msgpack",
        "image/*",
        "multipart/form-data",
        "application/octet-stream",
    ):
        assert accepted in message
    assert error_of(
        call(gateway, "/v1/models/detector:detect", JPEG, None), 415, "INVALID_ARGUMENT"
    )


def test_over_the_limits_is_413(gateway) -> None:
    # An image within the body limit but over max-image-bytes: the pipeline's TOO_LARGE.
    pixels = np.random.default_rng(0).integers(0, 256, (1250, 1250, 3), dtype=np.uint8)
    big_png = scenes.encode(pixels, "PNG")
    assert MAX_IMAGE_BYTES < len(big_png) < MAX_IMAGE_BYTES + 1024 * 1024
    message = error_of(
        call(gateway, "/v1/models/detector:detect", big_png, "image/png"), 413, "INVALID_ARGUMENT"
    )
    assert "GATEWAY_MAX_IMAGE_BYTES" in message
    # A body over the limit: refused from Content-Length.
    too_big = bytes(MAX_IMAGE_BYTES + 2 * 1024 * 1024)
    message = error_of(
        call(gateway, "/v1/models/detector:detect", too_big, "image/jpeg"), 413, "INVALID_ARGUMENT"
    )
    assert "request body" in message
    # JSON carries base64: an image that fits as bytes fits as JSON too.
    image = scenes.encode(np.zeros((8, 8, 3), np.uint8), "PNG")
    padded = image + bytes(MAX_IMAGE_BYTES - len(image) - 10)
    body = json.dumps({"image": base64.b64encode(padded).decode()}).encode()
    assert len(body) > MAX_IMAGE_BYTES + 1024 * 1024
    status, _, raw = call(gateway, "/v1/models/detector:detect", body, "application/json")
    assert status == 200, raw  # PNG decoders ignore bytes after IEND


def test_curl_every_body_type_and_route(gateway, channel, tmp_path: Path) -> None:
    expected = grpc_detect(channel, JPEG, min_score=0.5)
    image = tmp_path / "scene.jpg"
    image.write_bytes(JPEG)
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"image": base64.b64encode(JPEG).decode(), "min_score": 0.5}))
    packed = tmp_path / "request.msgpack"
    packed.write_bytes(msgpack.packb({"image": JPEG, "min_score": 0.5, "camera": "cam-7"}))

    raw = curl(
        gateway,
        "/v1/models/detector:detect?min_score=0.5",
        "-H",
        "Content-Type: image/jpeg",
        "--data-binary",
        f"@{image}",
    )
    assert comparable(ok_json(raw)) == expected
    as_json = curl(
        gateway,
        "/v1/models/detector:detect",
        "-H",
        "Content-Type: application/json",
        "-d",
        f"@{request}",
    )
    assert comparable(ok_json(as_json)) == expected
    form = curl(
        gateway, "/v1/models/detector:detect", "-F", f"image=@{image}", "-F", "min_score=0.5"
    )
    assert comparable(ok_json(form)) == expected
    status, headers, body = curl(
        gateway,
        "/invocations",
        "-H",
        "Content-Type: application/x-msgpack",
        "-H",
        "Accept: application/x-msgpack",
        "-H",
        "x-request-id: curl-1",
        "--data-binary",
        f"@{packed}",
    )
    assert status == 200 and headers["x-request-id"] == "curl-1"
    result = msgpack.unpackb(body)
    assert result["metadata"] == {"camera": "cam-7"} and result["request_id"] == "curl-1"
    assert len(result["detections"]) == len(expected["detections"])
    assert ok_status(curl(gateway, "/ping")) == {}
    assert (
        ok_status(curl(gateway, "/v1/models/detector"))["model_version_status"][0]["state"]
        == "AVAILABLE"
    )
    assert "paths" in ok_status(curl(gateway, "/openapi.json"))
    status, headers, body = curl(gateway, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"<canvas" in body
    assert curl(gateway, "/v1/models/detector:detect", "-X", "GET")[0] == 405
    assert curl(gateway, "/nothing")[0] == 404
    assert (
        curl(gateway, "/v1/models/detector:detect", "-H", "Content-Type: text/plain", "-d", "x")[0]
        == 415
    )


def test_curl_streams_a_1_gb_upload_into_a_413(gateway) -> None:
    """curl uploads 1 GB chunked from a pipe; the gateway refuses it once past the limit."""
    command = (
        "head -c 1073741824 /dev/zero | curl -sS -o - -w '\\n%{http_code}' -X POST "
        f"-H 'Content-Type: image/jpeg' -T - {gateway.http_url}/v1/models/detector:detect"
    )
    run = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120, check=False)
    body, _, code = run.stdout.rpartition(b"\n")
    assert code == b"413", run.stdout[-500:] + run.stderr[-500:]
    assert json.loads(body)["error"]["code"] == "INVALID_ARGUMENT"


def test_browser_page_is_self_contained(gateway) -> None:
    status, headers, body = call(gateway, "/")
    assert status == 200
    html = body.decode()
    assert (
        "<script src" not in html
        and "<link" not in html
        and "http://" not in html.replace("http://www.w3.org", "")
    )
    assert "default-src 'none'" in headers["content-security-policy"]
    assert '"colours": "classification"' in html and '"detector": "detection"' in html


def test_expect_100_continue_refuses_a_declared_oversize_body_before_it_is_sent(
    gateway, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(40 * 1024 * 1024))
    small = tmp_path / "scene.jpg"
    small.write_bytes(JPEG)
    binary = tools.binary("curl", tools.CURL_INSTALL)

    def upload(path: Path) -> tuple[str, int]:
        run = subprocess.run(
            [binary, "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_upload}",
             "-H", "Expect: 100-continue", "-H", "Content-Type: image/jpeg",
             "--data-binary", f"@{path}", f"{gateway.http_url}/v1/models/detector:detect"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        code, sent = run.stdout.split()
        return code, int(sent)

    code, sent = upload(big)
    assert code == "413"
    assert sent < 1024 * 1024  # curl stopped at the 413 instead of sending 40 MB
    assert upload(small) == ("200", len(JPEG))
