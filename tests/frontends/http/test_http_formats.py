"""The HTTP door end to end, beside the detections: /invocations with the default model,
/ping and model status, the OpenAPI document, MessagePack (metadata byte for byte, Accept),
request ids and trace headers in the request log, and the metrics by route.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import msgpack
import numpy as np

from tests.support.httpcalls import (
    JPEG,
    assert_scene,
    call,
    comparable,
    error_of,
    grpc_detect,
    ok_json,
    ok_status,
)


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


def test_openapi_is_served(gateway) -> None:
    document = ok_status(call(gateway, "/openapi.json"))
    assert document["openapi"].startswith("3.")
    assert "/v1/models/{model}:detect" in document["paths"]
    assert "/invocations" in document["paths"]


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
    assert 'vision_gateway_requests_total{code="OK",method="POST /invocations"}' in text
    assert (
        'vision_gateway_requests_total{code="INVALID_ARGUMENT",method="POST /invocations"}' in text
    )
    assert 'method="POST :detect"' in text
