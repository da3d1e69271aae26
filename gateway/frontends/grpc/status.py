"""The gRPC door's one error table: domain error kinds -> gRPC status codes; and the abort
that carries an error's retry delay as google.rpc.RetryInfo in the status details."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.rpc import error_details_pb2, status_pb2

from gateway.errors import GatewayError, Kind

# Where gRPC carries a google.rpc.Status with details (grpcio-status reads it from here).
DETAILS_KEY = "grpc-status-details-bin"

Code = grpc.StatusCode
STATUS: dict[Kind, grpc.StatusCode] = {
    Kind.INVALID_INPUT: Code.INVALID_ARGUMENT,
    # An image over a limit never passes, so not RESOURCE_EXHAUSTED (which clients retry).
    Kind.TOO_LARGE: Code.INVALID_ARGUMENT,
    # Work over an operator's cap: RESOURCE_EXHAUSTED as gRPC's own message-size limits.
    Kind.TOO_COSTLY: Code.RESOURCE_EXHAUSTED,
    Kind.OUT_OF_RANGE: Code.OUT_OF_RANGE,
    Kind.NOT_FOUND: Code.NOT_FOUND,
    Kind.BAD_MODEL: Code.FAILED_PRECONDITION,
    Kind.OVERLOADED: Code.RESOURCE_EXHAUSTED,
    Kind.UNAVAILABLE: Code.UNAVAILABLE,
    Kind.DEADLINE: Code.DEADLINE_EXCEEDED,
    Kind.CANCELLED: Code.CANCELLED,
    Kind.INTERNAL: Code.INTERNAL,
    Kind.PERMISSION_DENIED: Code.PERMISSION_DENIED,
    Kind.ALREADY_EXISTS: Code.ALREADY_EXISTS,
    Kind.PRECONDITION: Code.FAILED_PRECONDITION,
    Kind.DATA_LOSS: Code.DATA_LOSS,
    Kind.ABORTED: Code.ABORTED,
}


async def abort(
    context: grpc.aio.ServicerContext,
    error: GatewayError,
    trailers: Sequence[tuple[str, str]] = (),
) -> None:
    """Ends the call with the error's status; `trailers` (e.g. x-request-id) are sent with
    it, and a retry delay, when the error has one, as google.rpc.RetryInfo. Raises."""
    code, delay = STATUS[error.kind], error.retry_after
    if delay is None:
        await context.abort(code, error.message)
        return
    status = status_pb2.Status(code=code.value[0], message=error.message)
    info = error_details_pb2.RetryInfo()
    info.retry_delay.FromNanoseconds(round(delay * 1e9))
    status.details.add().Pack(info)
    metadata = (*trailers, (DETAILS_KEY, status.SerializeToString()))
    await context.abort(code, error.message, metadata)
