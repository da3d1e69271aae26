"""tests/support/sidecar.py, the Istio sidecar the cluster tests put in front of the gateway:
it forwards calls unchanged apart from the identity header, and the caller's deadline as the
caller set it (none when none)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from tests.support.deadline import forwarded_timeout
from tests.support.sidecar import XFCC, sidecar

IDENTITY = "spiffe://cluster.local/ns/detection/sa/detection-batch"


class _Recorder(grpc.GenericRpcHandler):
    """The gateway's side: what each call arrived with."""

    def __init__(self) -> None:
        self.remaining: list[float | None] = []
        self.xfcc: list[str] = []

    def _record(self, context: grpc.ServicerContext) -> None:
        self.remaining.append(forwarded_timeout(context))
        self.xfcc.append(dict(context.invocation_metadata()).get(XFCC, ""))

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if details.method.endswith("Stream"):

            def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
                self._record(context)
                yield from requests

            return grpc.stream_stream_rpc_method_handler(stream)

        def one(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._record(context)
            return request

        return grpc.unary_unary_rpc_method_handler(one)


@pytest.fixture
def forwarded() -> Iterator[tuple[_Recorder, grpc.Channel]]:
    recorder = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((recorder,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with (
            sidecar(f"127.0.0.1:{port}", IDENTITY) as target,
            grpc.insecure_channel(target) as channel,
        ):
            yield recorder, channel
    finally:
        server.stop(grace=None)


def test_a_call_without_a_deadline_is_forwarded_without_one(
    forwarded: tuple[_Recorder, grpc.Channel],
) -> None:
    """A runner's streams set no deadline. The sidecar used to forward a synchronous server's
    "about 2**63 s left" as a timeout, which gRPC read as a deadline already passed: every
    forwarded call failed with DEADLINE_EXCEEDED while the clock rounded that way."""
    recorder, channel = forwarded
    unary = channel.unary_unary("/detection.v1.DetectionService/Detect")
    stream = channel.stream_stream("/detection.v1.DetectionService/DetectStream")
    for _ in range(5):
        assert unary(b"image") == b"image"
        assert list(stream(iter([b"a", b"b"]))) == [b"a", b"b"]
    assert recorder.remaining == [None] * 10


def test_a_deadline_and_the_identity_are_forwarded(
    forwarded: tuple[_Recorder, grpc.Channel],
) -> None:
    recorder, channel = forwarded
    unary = channel.unary_unary("/detection.v1.DetectionService/Detect")
    forged = ((XFCC, "By=spiffe://x;URI=spiffe://cluster.local/ns/shop/sa/admin"),)
    assert unary(b"image", timeout=30, metadata=forged) == b"image"
    [remaining] = recorder.remaining
    assert remaining is not None and 25 < remaining <= 31  # gRPC rounds the timeout it sends up
    [xfcc] = recorder.xfcc
    assert xfcc.endswith(f";URI={IDENTITY}") and "admin" not in xfcc
