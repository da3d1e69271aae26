"""The gRPC door's one error table: domain error kinds -> gRPC status codes."""

from __future__ import annotations

import grpc

from gateway.errors import Kind

C = grpc.StatusCode
STATUS: dict[Kind, grpc.StatusCode] = {
    Kind.INVALID_INPUT: C.INVALID_ARGUMENT,
    # An image over a limit never passes, so not RESOURCE_EXHAUSTED (which clients retry).
    Kind.TOO_LARGE: C.INVALID_ARGUMENT,
    Kind.OUT_OF_RANGE: C.OUT_OF_RANGE,
    Kind.NOT_FOUND: C.NOT_FOUND,
    Kind.BAD_MODEL: C.FAILED_PRECONDITION,
    Kind.OVERLOADED: C.RESOURCE_EXHAUSTED,
    Kind.UNAVAILABLE: C.UNAVAILABLE,
    Kind.DEADLINE: C.DEADLINE_EXCEEDED,
    Kind.CANCELLED: C.CANCELLED,
    Kind.INTERNAL: C.INTERNAL,
    Kind.PERMISSION_DENIED: C.PERMISSION_DENIED,
    Kind.ALREADY_EXISTS: C.ALREADY_EXISTS,
    Kind.PRECONDITION: C.FAILED_PRECONDITION,
    Kind.DATA_LOSS: C.DATA_LOSS,
    Kind.ABORTED: C.ABORTED,
}
