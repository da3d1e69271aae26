"""The gRPC door's one error table: domain error kinds -> gRPC status codes."""

from __future__ import annotations

import grpc

from gateway.errors import Kind

Code = grpc.StatusCode
STATUS: dict[Kind, grpc.StatusCode] = {
    Kind.INVALID_INPUT: Code.INVALID_ARGUMENT,
    # An image over a limit never passes, so not RESOURCE_EXHAUSTED (which clients retry).
    Kind.TOO_LARGE: Code.INVALID_ARGUMENT,
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
