"""The jobs routes' edges (issue 33 item 6), through the real doors: raw sockets for bodies
split, short or trickling, gRPC streams that stall, and bytes no name or URI may hold.

Rows of the attack table in docs/security.md, each proved by the test named after it.
"""

from __future__ import annotations

import io
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from PIL import Image

from gateway.proto.vision.v1 import batch_pb2 as bpb
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, gateway, make_images
from tests.support.localserver import LocalServer

BODY_TIMEOUT = 1.5
UPLOAD_TIMEOUT = 3.0
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("door-edges-data")
    make_images(root / "set", 2)
    return root


@pytest.fixture(scope="module")
def gw(
    tfs: LocalServer, data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("door-edges")
    extra = [
        f"--batch-allowed-input-uris={data}",
        f"--http-body-timeout={BODY_TIMEOUT}",
        f"--batch-upload-timeout={UPLOAD_TIMEOUT}",
    ]
    with gateway(tfs, root / "store", root, extra, http=True) as process:
        yield process


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (20, 90, 160)).save(buffer, "JPEG")
    return buffer.getvalue()


def answer(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes (a socket timeout only bounds it)."""
    sock.settimeout(60)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def head(path: str, length: int, content_type: str = "application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


def test_a_create_body_in_two_tcp_segments_is_read_whole(gw: GatewayProcess, data: Path) -> None:
    body = json.dumps({"input_uri": str(data / "set")}).encode()
    with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head("/v1/batchJobs", len(body)) + body[:9])
        # A pause well inside the body timeout, so the halves arrive as two segments (the
        # outcome does not depend on it: a body read whole is the same either way).
        time.sleep(0.3)
        sock.sendall(body[9:])
        got = answer(sock)
    assert got.startswith(b"HTTP/1.1 200"), got[:400]
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["name"].startswith("operations/")


@pytest.mark.parametrize("sent", [0, 4], ids=["no-body", "short-body"])
def test_a_create_body_that_never_arrives_is_408(gw: GatewayProcess, sent: int) -> None:
    """`Content-Length: 10` and no body (or 4 bytes of it): 408 after the body timeout."""
    with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
        started = time.monotonic()
        sock.sendall(head("/v1/batchJobs", 10) + b'{"in'[:sent])
        got = answer(sock)
    assert got.startswith(b"HTTP/1.1 408"), got[:400]
    assert b"GATEWAY_HTTP_BODY_TIMEOUT" in got
    assert time.monotonic() - started >= BODY_TIMEOUT


def test_a_trickling_upload_ends_at_its_deadline_on_both_doors(gw: GatewayProcess) -> None:
    """A multipart upload that sends one tiny image part every 0.3 s (each step well within
    the body timeout), and an UploadImages stream that sends one image and then nothing:
    both end at GATEWAY_BATCH_UPLOAD_TIMEOUT, 408 / DEADLINE_EXCEEDED naming it."""
    boundary = "trickle"
    content_type = f"multipart/form-data; boundary={boundary}"
    with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
        started = time.monotonic()
        sock.sendall(head("/v1/uploads", 10_000_000, content_type))
        # A part each time the gateway has sent nothing for 0.3 s, until it answers.
        count = 0
        while not select.select([sock], [], [], 0.3)[0]:
            assert time.monotonic() - started < 60, "the trickling upload was never cut"
            sock.sendall(
                f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
                f'filename="i{count}.jpg"\r\n\r\nJFIF\r\n'.encode()
            )
            count += 1
        got = answer(sock)
    assert got.startswith(b"HTTP/1.1 408"), got[:400]
    assert b"GATEWAY_BATCH_UPLOAD_TIMEOUT" in got
    assert time.monotonic() - started >= UPLOAD_TIMEOUT

    release = threading.Event()

    def stalled() -> Iterator[bpb.UploadImagesRequest]:
        yield bpb.UploadImagesRequest(name="a.jpg", image=jpeg())
        release.wait(120)  # then nothing more, until the test is over

    with gw.channel() as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            Client(channel).batch.UploadImages(stalled(), timeout=60)
        release.set()
    assert info.value.code() == Code.DEADLINE_EXCEEDED, info.value.details()
    assert "GATEWAY_BATCH_UPLOAD_TIMEOUT" in (info.value.details() or "")
    assert time.monotonic() - started >= UPLOAD_TIMEOUT


def test_nul_bytes_and_odd_names_are_invalid_argument_without_a_traceback(
    gw: GatewayProcess, data: Path
) -> None:
    images = str(data / "set")
    with gw.channel() as channel:
        client = Client(channel)
        for fields in (
            {"input_uri": images + "\x00/etc/passwd"},
            {"input_uri": images, "output_uri": "/tmp/out\x00"},
            {"input_uri": images, "request_id": "a\x00b"},
        ):
            with pytest.raises(grpc.RpcError) as info:
                client.create(**fields)
            assert info.value.code() == Code.INVALID_ARGUMENT, info.value.details()
            assert "control character" in (info.value.details() or "")
        for name in ("a.jpg\n", "a\x00.jpg", "\na.jpg"):
            with pytest.raises(grpc.RpcError) as info:
                request = bpb.UploadImagesRequest(name=name, image=jpeg())
                client.batch.UploadImages(iter([request]), timeout=30)
            assert info.value.code() == Code.INVALID_ARGUMENT, (name, info.value.details())
    body = json.dumps({"input_uri": images + "\x00"}).encode()
    with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
        sock.sendall(head("/v1/batchJobs", len(body)) + body)
        got = answer(sock)
    assert got.startswith(b"HTTP/1.1 400"), got[:400]
    assert b'"code":"INVALID_ARGUMENT"' in got and b"control character" in got
    text = gw.log_path.read_text()
    assert "Traceback" not in text and '"level":"ERROR"' not in text, text[-3000:]
