"""Caller strings at every door (issue 42.6) and one reader of caller identity (42.8), through
the real doors: a grpc.aio server called with real stubs and an aiohttp app sent real bodies,
over the real pipeline (tests/support/doors.py).

A request id of 8 MiB or with NUL/LF/TAB, an over-long trace header or model name: refused
with INVALID_ARGUMENT / 400 before any work (TF Serving is never called), under a request id
of the gateway's, and with nothing logged at ERROR (no traceback) by any door.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from PIL import Image
from prometheus_client import REGISTRY

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support.doormodels import models, write_model_config
from tests.support.doors import InProcessDoors
from tests.support.pictures import encode, pattern

Code = grpc.StatusCode
FORGED = "spiffe://test.local/ns/evil/sa/forged"
VOUCHED = "spiffe://test.local/ns/shop/sa/vouched"
SLOW = "spiffe://test.local/ns/slow/sa/app"  # one request, then over its rate for 1000 s
# Each a request id the rule refuses: too long, or a character headers cannot carry.
BAD_IDS = {
    "8MiB": "a" * (8 << 20),
    "60KiB": "a" * (60 << 10),
    "65": "b" * 65,
    "NUL": "id\x00x",
    "LF": "id\nx-injected: 1",
    "TAB": "id\tx",
    "non-ASCII": "id\u00e9",
}


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDoors]:
    root = tmp_path_factory.mktemp("strings")
    config = write_model_config(root)
    quotas = root / "quotas.toml"
    quotas.write_text(
        f'[callers."uri:{FORGED}"]\nrate = 1000\n[callers."uri:{VOUCHED}"]\n'
        f'[callers."uri:{SLOW}"]\nrate = 0.001\nburst = 1\n'
    )
    with InProcessDoors(
        models(),
        model_config=str(config),
        trust_xfcc=True,
        quotas=str(quotas),
        max_receive_message_bytes=16 << 20,
    ) as running:
        yield running


@pytest.fixture()
def image() -> bytes:
    return encode(Image.fromarray(pattern(64, 48)), "PNG")


def _no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage()[:200] for r in bad]


def _is_gateway_id(value: str) -> bool:
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)


@pytest.mark.parametrize("bad", list(BAD_IDS), ids=list(BAD_IDS))
def test_a_bad_request_id_is_refused_at_the_grpc_door_before_any_work(
    doors: InProcessDoors, image: bytes, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls = len(doors.serving.calls)
    options = [("grpc.max_send_message_length", 32 << 20)]
    with grpc.insecure_channel(doors.grpc_target, options=options) as channel:
        stub = pb_grpc.DetectionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Detect(pb.DetectRequest(image=image, request_id=BAD_IDS[bad]), timeout=60)
        error = info.value
        assert error.code() == Code.INVALID_ARGUMENT, error.details()
        assert error.details().startswith("request_id "), error.details()
        assert len(error.details()) < 200  # the id is not echoed back
        trailing = dict(error.trailing_metadata() or ())
        assert _is_gateway_id(trailing["x-request-id"])
        # A stream: that frame's result holds the error; the stream goes on.
        frames = [
            pb.DetectRequest(image=image, request_id=BAD_IDS[bad]),
            pb.DetectRequest(image=image, request_id="fine-1"),
        ]
        results = list(stub.DetectStream(iter(frames), timeout=60))
    assert results[0].error.code == Code.INVALID_ARGUMENT.value[0]
    assert results[0].request_id.endswith("-0") and len(results[0].request_id) < 64
    assert results[1].request_id == "fine-1" and results[1].detections
    assert len(doors.serving.calls) == calls + 1  # only the good frame reached TF Serving
    _no_error_logged(caplog)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("x-request-id", "c" * 65, "the x-request-id header is 65 characters"),
        ("traceparent", "0" * 600, "the traceparent header is 600 characters; the limit is 512"),
        ("tracestate", "k=v," * 200, "the tracestate header is 800 characters"),
    ],
)
def test_bad_trace_headers_are_refused_at_the_grpc_door(
    doors: InProcessDoors, image: bytes, key: str, value: str, named: str
) -> None:
    calls = len(doors.serving.calls)
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.DetectionServiceStub(channel)
        metadata = ((key, value),)
        try:
            stub.Detect(pb.DetectRequest(image=image), metadata=metadata, timeout=60)
        except grpc.RpcError as error:
            assert error.code() == Code.INVALID_ARGUMENT, error.details()
            assert named in error.details()
        else:
            pytest.fail("the call was not refused")
    assert len(doors.serving.calls) == calls


def _post(
    doors: InProcessDoors, path: str, body: bytes, headers: list[tuple[str, str]]
) -> tuple[int, dict[str, str], dict]:
    connection = http.client.HTTPConnection("127.0.0.1", doors.http_port, timeout=60)
    try:
        connection.putrequest("POST", path)
        for key, value in [*headers, ("Content-Length", str(len(body)))]:
            connection.putheader(key, value)
        connection.endheaders(body)
        response = connection.getresponse()
        return (
            response.status,
            {k.lower(): v for k, v in response.getheaders()},
            json.loads(response.read()),
        )
    finally:
        connection.close()


@pytest.mark.parametrize("bad", list(BAD_IDS), ids=list(BAD_IDS))
def test_a_bad_request_id_is_refused_at_the_http_door_before_any_work(
    doors: InProcessDoors, image: bytes, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls = len(doors.serving.calls)
    body = json.dumps(
        {"image": base64.b64encode(image).decode(), "request_id": BAD_IDS[bad]}
    ).encode()
    status, headers, answer = _post(
        doors, "/v1/models/detector:detect", body, [("Content-Type", "application/json")]
    )
    assert answer["error"]["code"] == "INVALID_ARGUMENT"
    if bad == "8MiB":  # over the body's metadata limit (GATEWAY_HTTP_MAX_METADATA_BYTES)
        assert status == 413 and "the JSON body has" in answer["error"]["message"]
    else:
        assert status == 400, answer
        assert answer["error"]["message"].startswith("request_id "), answer
    assert _is_gateway_id(headers["x-request-id"])
    assert len(doors.serving.calls) == calls
    _no_error_logged(caplog)


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "m" * 129), ("name", "detector\n"), ("label", "l" * 129), ("label", "x\x00")],
)
def test_a_bad_model_name_or_label_is_refused_at_both_doors(
    doors: InProcessDoors, image: bytes, field: str, value: str
) -> None:
    calls = len(doors.serving.calls)
    spec = model_pb2.ModelSpec(**{field: value})
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.DetectionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Detect(pb.DetectRequest(image=image, model=spec), timeout=60)
    assert info.value.code() == Code.INVALID_ARGUMENT
    assert info.value.details().startswith(f"model.{field} ")
    body = {"image": base64.b64encode(image).decode(), "model": {field: value}}
    status, _, answer = _post(
        doors, "/invocations", json.dumps(body).encode(), [("Content-Type", "application/json")]
    )
    assert status == 400 and answer["error"]["message"].startswith(f"model.{field} "), answer
    assert len(doors.serving.calls) == calls


def _admitted(table: str) -> float:
    value = REGISTRY.get_sample_value(
        "vision_gateway_caller_requests_total", {"caller": table, "decision": "admitted"}
    )
    return value or 0.0


def test_every_door_trusts_the_last_x_forwarded_client_cert_element(
    doors: InProcessDoors, image: bytes
) -> None:
    """The client sends its own header naming FORGED; the proxy nearest the gateway appends
    its element, as a second header, naming VOUCHED. gRPC and HTTP both take VOUCHED (the
    quota table the request is counted under)."""
    vouched, forged = f"uri:{VOUCHED}", f"uri:{FORGED}"
    before = _admitted(vouched), _admitted(forged)
    xfcc = [
        ("x-forwarded-client-cert", f"URI={FORGED}"),
        ("x-forwarded-client-cert", f"By=spiffe://test.local/gw;URI={VOUCHED}"),
    ]
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.DetectionServiceStub(channel)
        stub.Detect(pb.DetectRequest(image=image), metadata=tuple(xfcc), timeout=60)
    status, _, answer = _post(
        doors, "/v1/models/detector:detect", image, [("Content-Type", "image/png"), *xfcc]
    )
    assert status == 200, answer
    assert (_admitted(vouched) - before[0], _admitted(forged) - before[1]) == (2, 0)


def test_one_function_reads_the_caller_at_every_door() -> None:
    """No door reads certificates or x-forwarded-client-cert itself: each calls
    gateway.identity.of_grpc or of_http."""
    root = Path(__file__).resolve().parents[2] / "gateway" / "frontends"
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for reader in ("from_auth_context", "from_peercert", "identity.XFCC", "identity.caller("):
            assert reader not in text, f"{path} reads the caller itself ({reader})"


def test_a_caller_over_its_quota_is_refused_before_its_body_is_read(
    doors: InProcessDoors, image: bytes
) -> None:
    """HTTP: the quota is asked before the body is read, so a caller over it costs no read
    and no parse: a request announcing 10 MB and sending none of it gets its 429 at once."""
    xfcc = ("x-forwarded-client-cert", f"By=spiffe://test.local/gw;URI={SLOW}")
    status, _, _ = _post(
        doors, "/v1/models/detector:detect", image, [("Content-Type", "image/png"), xfcc]
    )
    assert status == 200  # its one token
    with socket.create_connection(("127.0.0.1", doors.http_port), timeout=30) as raw:
        raw.sendall(
            b"POST /v1/models/detector:detect HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: image/png\r\nContent-Length: 10000000\r\n"
            + f"{xfcc[0]}: {xfcc[1]}\r\n\r\n".encode()
        )
        answer = raw.recv(65536).decode()  # the body is never sent: no read waits for it
    assert answer.startswith("HTTP/1.1 429"), answer[:200]
    assert f"caller uri:{SLOW} is over its rate" in answer
    assert "retry-after" in answer.lower()
    # With `Expect: 100-continue` (curl's way for bodies over 1 MB) the refusal comes
    # instead of the 100 Continue, so the client never starts sending.
    with socket.create_connection(("127.0.0.1", doors.http_port), timeout=30) as raw:
        raw.sendall(
            b"POST /v1/models/detector:detect HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Type: image/png\r\nContent-Length: 10000000\r\n"
            + f"{xfcc[0]}: {xfcc[1]}\r\n\r\n".encode()
        )
        answer = raw.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 429"), answer[:200]
    assert "retry-after" in answer.lower() and "over its rate" in answer


def test_an_identity_the_gateway_cannot_take_is_refused_at_the_inference_doors(
    doors: InProcessDoors, image: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A trusted x-forwarded-client-cert naming a 1,100-character URI: PERMISSION_DENIED on
    gRPC and 403 on HTTP, before any work (before this, the gRPC door let the error escape:
    UNKNOWN and a traceback)."""
    calls = len(doors.serving.calls)
    xfcc = ("x-forwarded-client-cert", "By=spiffe://test.local/gw;URI=spiffe://x/" + "a" * 1100)
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.DetectionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Detect(pb.DetectRequest(image=image), metadata=(xfcc,), timeout=60)
    assert info.value.code() == Code.PERMISSION_DENIED
    assert "at most 1024" in info.value.details()
    status, _, answer = _post(
        doors, "/v1/models/detector:detect", image, [("Content-Type", "image/png"), xfcc]
    )
    assert status == 403 and answer["error"]["code"] == "PERMISSION_DENIED"
    assert len(doors.serving.calls) == calls
    _no_error_logged(caplog)
