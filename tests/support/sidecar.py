"""A pod's Istio sidecar as the gateway sees it, for tests that run a pod's command on
loopback: every call forwarded to the gateway unchanged, with the x-forwarded-client-cert
header the sidecar sets (the pod's verified mesh identity as its last element, whatever the
pod sent). Requests and answers pass as bytes; a method whose name ends in `Stream` is a
bidirectional stream (the task services' streams), any other a unary call (what a batch
runner calls)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from tests.support.deadline import forwarded_timeout

XFCC = "x-forwarded-client-cert"
# A forwarded stream holds one of the server's threads until it ends: a runner opens
# --concurrency / --stream-window streams (16 by default) and keeps them open for its whole
# shard, so a pool of 16 left one runner's last stream waiting for a thread, its images
# unanswered until the runner gave up (test_jobs_cluster failed so under load).
WORKERS = 256
_LIMITS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, channel: grpc.Channel, identity: str) -> None:
        self._channel = channel
        self._xfcc = f"By=spiffe://cluster.local/ns/detection/sa/detection-gateway;URI={identity}"

    def _metadata(self, context: grpc.ServicerContext) -> list[tuple[str, Any]]:
        kept = [
            (k, v)
            for k, v in context.invocation_metadata()
            if k != XFCC and k != "user-agent" and not k.startswith(("grpc-", ":"))
        ]
        return [*kept, (XFCC, self._xfcc)]

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        if method.endswith("Stream"):
            call = self._channel.stream_stream(method)

            def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
                try:
                    yield from call(
                        requests,
                        metadata=self._metadata(context),
                        timeout=forwarded_timeout(context),
                    )
                except grpc.RpcError as e:
                    context.abort(e.code(), e.details() or "")

            return grpc.stream_stream_rpc_method_handler(stream)
        unary = self._channel.unary_unary(method)

        def one(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                return bytes(
                    unary(
                        request,
                        metadata=self._metadata(context),
                        timeout=forwarded_timeout(context),
                    )
                )
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")

        return grpc.unary_unary_rpc_method_handler(one)


@contextmanager
def sidecar(target: str, identity: str) -> Iterator[str]:
    """Yields the sidecar's address (127.0.0.1, a port the OS picks) in front of `target`,
    naming `identity` (a SPIFFE URI) as the caller."""
    channel = grpc.insecure_channel(target, options=_LIMITS)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS), options=_LIMITS)
    server.add_generic_rpc_handlers((_Forward(channel, identity),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
        channel.close()
