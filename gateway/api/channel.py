"""Calling a gateway over gRPC: channels (message limits for large images, TLS when given) and
a task's RPCs made from its binding, for the client and the batch runner."""

from __future__ import annotations

from typing import Any

import grpc

from gateway.api.bindings import Binding
from gateway.tls import TLS

# Room for the gateway's default 32 MiB image limit plus the rest of the message.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def channel_options(
    tls: TLS | None, max_message_bytes: int, connection: int | None = None
) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    if connection is not None:
        # A distinct argument per channel: gRPC would otherwise share one connection between
        # channels with equal arguments (several connections reach several gateway workers
        # or pods).
        options.append(("grpc.gateway_client_connection", connection))
    if tls is not None:
        options += tls.channel_options()
    return options


def open_channel(
    target: str,
    tls: TLS | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A blocking channel to the gateway."""
    options = channel_options(tls, max_message_bytes)
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, tls.credentials(), options=options)


def open_aio_channel(
    target: str,
    tls: TLS | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    connection: int | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to the gateway; channels with different `connection` numbers use
    connections of their own."""
    options = channel_options(tls, max_message_bytes, connection)
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, tls.credentials(), options=options)


def task_methods(channel: Any, binding: Binding) -> tuple[Any, Any]:
    """The binding's unary and streaming multi-callables on `channel` (blocking or aio)."""
    service = binding.service_name
    serialize = binding.request_type.SerializeToString
    parse = binding.result_type.FromString
    unary = channel.unary_unary(
        f"/{service}/{binding.unary}",
        request_serializer=serialize,
        response_deserializer=parse,
        _registered_method=True,
    )
    stream = channel.stream_stream(
        f"/{service}/{binding.stream}",
        request_serializer=serialize,
        response_deserializer=parse,
        _registered_method=True,
    )
    return unary, stream


class AioTaskStub:
    """A task's RPCs on an asyncio channel: `unary(request, timeout=...)` and `stream()`
    (a stream-stream call to write requests to and read results from)."""

    def __init__(self, channel: grpc.aio.Channel, binding: Binding) -> None:
        self.binding = binding
        self.unary, self.stream = task_methods(channel, binding)
