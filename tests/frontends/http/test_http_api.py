"""The HTTP door end to end: urllib and the real `curl` -> gateway (HTTP) -> local TF Serving.

Every route, every body type, both response types, metadata echoed byte for byte, the error
rows that a healthy upstream can produce, and the same answers as the gRPC door.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgpack
import numpy as np
import pytest
from google.protobuf import json_format

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.frontends.http.conftest import MAX_IMAGE_BYTES, classifiers
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


@pytest.fixture(scope="module")
def gateway(http_gateway: GatewayProcess) -> GatewayProcess:
    return http_gateway


@pytest.fixture(scope="module")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with gateway.channel() as channel:
        yield channel


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


# --- every body type gives the same detections as gRPC -----------------------------------

BODIES = {
    "raw jpeg": lambda: (JPEG, "image/jpeg", "?min_score=0.5&max_detections=20"),
    "raw png": lambda: (PNG, "image/png", "?min_score=0.5&max_detections=20"),
    "octet-stream": lambda: (JPEG, "application/octet-stream", "?min_score=0.5&max_detections=20"),
    "x-image": lambda: (JPEG, "application/x-image", "?min_score=0.5&max_detections=20"),
    "json base64": lambda: (
        json.dumps(
            {"image": base64.b64encode(JPEG).decode(), "min_score": 0.5, "max_detections": 20}
        ).encode(),
        "application/json",
        "",
    ),
    "json b64 object": lambda: (
        json.dumps(
            {
                "image": {"b64": base64.b64encode(JPEG).decode()},
                "minScore": 0.5,
                "maxDetections": 20,
            }
        ).encode(),
        "application/json; charset=utf-8",
        "",
    ),
    "msgpack": lambda: (
        msgpack.packb({"image": JPEG, "min_score": 0.5, "max_detections": 20}),
        "application/x-msgpack",
        "",
    ),
    "msgpack alias": lambda: (
        msgpack.packb({"image": JPEG, "min_score": 0.5}),
        "application/msgpack",
        "?max_detections=20",
    ),
    "multipart": lambda: (*multipart({"min_score": "0.5", "max_detections": "20"}, JPEG), ""),
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_every_body_type_gives_the_grpc_door_s_detections(gateway, channel, kind) -> None:
    body, content_type, query = BODIES[kind]()
    image = PNG if kind == "raw png" else JPEG
    expected = grpc_detect(channel, image, min_score=0.5, max_detections=20)
    status, headers, raw = call(
        gateway,
        "/v1/models/detector:detect" + query,
        body,
        content_type,
        headers={"Accept": "application/json"},
    )
    result = ok_json((status, headers, raw))
    if "msgpack" in kind:  # MessagePack requests get their (here empty) metadata back
        assert result.pop("metadata") == {}
    assert comparable(result) == expected
    assert_scene(result)
    assert result["model"] == {"name": "detector", "version": "1"}


def test_results_print_every_field_even_zeros(gateway) -> None:
    # A rectangle in the top-left corner: its box starts at x_min = y_min = 0.
    pixels = np.full((120, 160, 3), 128, np.uint8)
    pixels[0:30, 0:40] = scenes.PALETTE[0].rgb
    result = ok_json(
        call(gateway, "/v1/models/detector:detect", scenes.encode(pixels, "PNG"), "image/png")
    )
    (detection,) = result["detections"]
    assert detection["box"] == {"x_min": 0, "y_min": 0, "x_max": 40, "y_max": 30}
    assert detection["normalized_box"]["x_min"] == 0
    empty = ok_json(
        call(
            gateway,
            "/v1/models/detector:detect",
            scenes.encode(pixels[60:, 60:], "PNG"),
            "image/png",
        )
    )
    assert empty["detections"] == []


def test_version_and_label_routes_name_the_version(gateway, channel) -> None:
    expected = grpc_detect(channel, JPEG, model=pb.ModelSpec(name="detector", version=1))
    for path in (
        "/v1/models/detector/versions/1:detect",
        "/v1/models/detector/labels/stable:detect",
    ):
        result = ok_json(call(gateway, path, JPEG, "image/jpeg"))
        assert comparable(result) == expected
        assert result["model"]["version"] == "1"
    message = error_of(
        call(gateway, "/v1/models/detector/versions/7:detect", JPEG, "image/jpeg"), 404, "NOT_FOUND"
    )
    assert "version 7" in message
    message = error_of(
        call(gateway, "/v1/models/detector/labels/beta:detect", JPEG, "image/jpeg"),
        400,
        "INVALID_ARGUMENT",
    )
    assert "beta" in message
    message = error_of(
        call(gateway, "/v1/models/detector/versions/one:detect", JPEG, "image/jpeg"),
        400,
        "INVALID_ARGUMENT",
    )
    assert "version in the path" in message


def test_encoded_model_route(gateway, channel) -> None:
    expected = grpc_detect(channel, JPEG, model=pb.ModelSpec(name="detector_encoded"))
    result = ok_json(call(gateway, "/v1/models/detector_encoded:detect", JPEG, "image/jpeg"))
    assert comparable(result) == expected
    assert_scene(result)


# --- classification ------------------------------------------------------------------------


def colour_image(shares: dict[tuple[int, int, int], int], width: int = 100) -> bytes:
    """A PNG whose rows are painted in the given colours, `share` rows each (100 rows)."""
    rows = [np.full((count, width, 3), rgb, np.uint8) for rgb, count in shares.items()]
    return scenes.encode(np.concatenate(rows), "PNG")


@pytest.mark.parametrize("route", ["/v1/models/{m}:classify", "/v1/models/{m}/versions/1:classify"])
def test_classify_gives_the_grpc_door_s_classes(gateway, channel, http_repo: Path, route) -> None:
    image = colour_image({(20, 20, 240): 70, (240, 20, 20): 30})
    stub = cpb_grpc.ClassificationServiceStub(channel)
    for name in classifiers(http_repo):
        expected = stub.Classify(
            cpb.ClassifyRequest(image=image, top_k=3, model=pb.ModelSpec(name=name)), timeout=60
        )
        expected_dict = comparable(
            json_format.MessageToDict(
                expected,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            )
        )
        result = ok_json(call(gateway, route.format(m=name) + "?top_k=3", image, "image/png"))
        assert comparable(result) == expected_dict, name
        assert result["classes"][0]["label"] == "blue", name
    colours = ok_json(call(gateway, route.format(m="colours") + "?top_k=3", image, "image/png"))
    assert [(c["label"], round(c["score"], 4)) for c in colours["classes"]] == [
        ("blue", 0.7),
        ("red", 0.3),
        ("green", 0.0),
    ]


def test_classify_as_msgpack_with_metadata(gateway) -> None:
    image = colour_image({(20, 240, 20): 100})
    body = msgpack.packb({"image": image, "top_k": 1, "frame": 17, "camera": "cam-7"})
    status, headers, raw = call(gateway, "/v1/models/colours:classify", body, "application/msgpack")
    assert status == 200 and headers["content-type"] == "application/x-msgpack"
    result = msgpack.unpackb(raw)
    assert result["classes"] == [{"class_id": 1, "label": "green", "score": 1.0}]
    assert result["metadata"] == {"frame": 17, "camera": "cam-7"}


def test_a_detection_model_on_the_classify_route_is_refused(gateway) -> None:
    message = error_of(
        call(gateway, "/v1/models/detector:classify", JPEG, "image/jpeg"),
        400,
        "FAILED_PRECONDITION",
    )
    assert "detector" in message


# --- /invocations, /ping, model status, openapi ------------------------------------------


def test_invocations_uses_the_default_model_and_its_task(gateway, channel) -> None:
    expected = grpc_detect(channel, JPEG, min_score=0.5, max_detections=3)
    body = json.dumps({"image": base64.b64encode(JPEG).decode(), "min_score": 0.5}).encode()
    result = ok_json(call(gateway, "/invocations?max_detections=3", body, "application/json"))
    assert comparable(result) == expected
    assert len(result["detections"]) == 3
    raw = ok_json(call(gateway, "/invocations?min_score=0.5&max_detections=3", JPEG, "image/jpeg"))
    assert comparable(raw) == expected
    # The query may name another model for /invocations (there is no model in its path).
    other = ok_json(call(gateway, "/invocations?model=detector_encoded", JPEG, "image/jpeg"))
    assert other["model"]["name"] == "detector_encoded"


def test_ping_and_model_status(gateway) -> None:
    status, headers, body = call(gateway, "/ping")
    assert (status, json.loads(body)) == (200, {})
    assert headers["content-type"].startswith("application/json")
    expected = {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }
    for path in (
        "/v1/models/detector",
        "/v1/models/detector/versions/1",
        "/v1/models/detector/labels/stable",
    ):
        assert ok_status(call(gateway, path)) == expected
    assert "nope" in error_of(call(gateway, "/v1/models/nope"), 404, "NOT_FOUND", request_id=False)


def ok_status(response: Response) -> Any:
    status, _, body = response
    assert status == 200, body
    return json.loads(body)


def test_openapi_is_served(gateway) -> None:
    document = ok_status(call(gateway, "/openapi.json"))
    assert document["openapi"].startswith("3.")
    assert "/v1/models/{model}:detect" in document["paths"]
    assert "/invocations" in document["paths"]


# --- MessagePack: metadata byte for byte, Accept -----------------------------------------


def test_msgpack_metadata_comes_back_byte_for_byte(gateway, channel) -> None:
    metadata = {
        "camera": "cam-7",
        "tags": ["street", "night", 3],
        "nested": {"a": [1, -2, 2**40, -(2**63)], "b": {"c": None, "d": True}},
        "ratio": 0.1,  # float 64
        "thumb": b"\x00\xff\x10raw",
        7: "an integer key",
    }
    packed_meta = {k: msgpack.packb(v) for k, v in metadata.items()}
    # A float 32 value: re-encoding would turn it into float 64, a copy keeps it.
    packer = msgpack.Packer(use_single_float=True)
    packed_meta["f32"] = packer.pack(1.5)
    entries = [msgpack.packb("image") + msgpack.packb(JPEG)]
    entries += [msgpack.packb(k) + v for k, v in packed_meta.items()]
    entries.insert(2, msgpack.packb("min_score") + msgpack.packb(0.5))  # options anywhere
    body = _map_header(len(entries)) + b"".join(entries)
    status, headers, raw = call(
        gateway,
        "/v1/models/detector:detect",
        body,
        "application/x-msgpack",
        headers={"x-request-id": "meta-1"},
    )
    assert status == 200 and headers["content-type"] == "application/x-msgpack"
    assert headers["x-request-id"] == "meta-1"
    result = msgpack.unpackb(raw, strict_map_key=False)
    assert result["request_id"] == "meta-1"
    # The metadata map's bytes are the request's entries, in order, unchanged.
    expected_meta = _map_header(len(packed_meta)) + b"".join(
        msgpack.packb(k) + v for k, v in packed_meta.items()
    )
    assert raw.endswith(msgpack.packb("metadata") + expected_meta)
    assert result["metadata"] == {**metadata, "f32": 1.5}
    # Detections as the gRPC door gives them (int64 as integers, floats as float 32).
    expected = grpc_detect(channel, JPEG, min_score=0.5)
    assert len(result["detections"]) == len(expected["detections"])
    for got, want in zip(result["detections"], expected["detections"], strict=True):
        assert got["box"] == want["box"] and got["label"] == want["label"]
        assert np.float32(got["score"]) == np.float32(want["score"])
    assert result["model"] == {"name": "detector", "version": 1}

    # Asked for JSON: the same metadata, bin as {"b64": ...}.
    as_json = ok_json(
        call(
            gateway,
            "/v1/models/detector:detect",
            body,
            "application/x-msgpack",
            headers={"Accept": "application/json"},
        )
    )
    assert as_json["metadata"] == {
        "camera": "cam-7",
        "tags": ["street", "night", 3],
        "nested": {"a": [1, -2, 2**40, -(2**63)], "b": {"c": None, "d": True}},
        "ratio": 0.1,
        "thumb": {"b64": base64.b64encode(b"\x00\xff\x10raw").decode()},
        "7": "an integer key",
        "f32": 1.5,
    }


def _map_header(count: int) -> bytes:
    return msgpack.Packer().pack_map_header(count)


def test_accept_msgpack_for_a_json_request_and_errors_in_msgpack(gateway) -> None:
    body = json.dumps({"image": base64.b64encode(JPEG).decode()}).encode()
    status, headers, raw = call(
        gateway,
        "/v1/models/detector:detect",
        body,
        "application/json",
        headers={"Accept": "application/x-msgpack"},
    )
    assert status == 200 and headers["content-type"] == "application/x-msgpack"
    assert_scene(msgpack.unpackb(raw))
    status, headers, raw = call(
        gateway,
        "/v1/models/detector:detect",
        b"{",
        "application/json",
        headers={"Accept": "application/msgpack"},
    )
    assert status == 400 and headers["content-type"] == "application/x-msgpack"
    assert msgpack.unpackb(raw)["error"]["code"] == "INVALID_ARGUMENT"


# --- request ids and trace headers --------------------------------------------------------


def test_request_id_in_and_out_and_trace_headers_reach_the_request_log(gateway) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    status, headers, body = call(
        gateway,
        "/v1/models/detector:detect",
        JPEG,
        "image/jpeg",
        headers={"x-request-id": "req-http-1", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    assert status == 200 and headers["x-request-id"] == "req-http-1"
    assert json.loads(body)["request_id"] == "req-http-1"
    # The body's request_id wins over the header, as in gRPC.
    json_body = json.dumps({"image": base64.b64encode(JPEG).decode(), "request_id": "from-body"})
    status, headers, _ = call(
        gateway,
        "/v1/models/detector:detect",
        json_body.encode(),
        "application/json",
        headers={"x-request-id": "from-header"},
    )
    assert headers["x-request-id"] == "from-body"
    # Without one, the gateway makes one; errors carry one too.
    _, headers, _ = call(gateway, "/v1/models/detector:detect", JPEG, "image/jpeg")
    assert len(headers["x-request-id"]) == 32
    _, headers, _ = call(gateway, "/v1/models/detector:detect", b"{", "application/json")
    assert len(headers["x-request-id"]) == 32
    record = next(r for r in gateway.records() if r.get("request_id") == "req-http-1")
    assert record["method"] == "POST :detect" and record["code"] == "OK"
    assert record["trace_id"] == trace_id


def test_metrics_count_http_requests_by_route(gateway) -> None:
    call(gateway, "/invocations", JPEG, "image/jpeg")
    call(gateway, "/invocations", b"", "text/csv")
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'detection_gateway_requests_total{code="OK",method="POST /invocations"}' in text
    assert (
        'detection_gateway_requests_total{code="INVALID_ARGUMENT",method="POST /invocations"}'
        in text
    )
    assert 'method="POST :detect"' in text


# --- errors a healthy upstream gives -----------------------------------------------------

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
        call(gateway, "/v1/models/detector:segment", JPEG, "image/jpeg"), 404, "NOT_FOUND"
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


# --- curl ---------------------------------------------------------------------------------


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
