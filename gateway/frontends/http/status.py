"""The HTTP door's one error table: domain error kinds -> HTTP statuses (google.rpc.Code's
HTTP mapping), plus the few failures only HTTP has (routes, methods, media types, bodies).

Every error answer is `{"error": {"code": <canonical status name>, "message": ...}}`; the
code is the one the request log and the metrics record (gateway.errors.Kind.code).
"""

from __future__ import annotations

from gateway.errors import Kind

STATUS: dict[Kind, int] = {
    Kind.INVALID_INPUT: 400,
    # An image over a limit never passes: 413, not 429 (which clients and meshes retry).
    Kind.TOO_LARGE: 413,
    # Work over an operator's cap never passes either: 413, as an image over its limit.
    Kind.TOO_COSTLY: 413,
    Kind.OUT_OF_RANGE: 400,
    Kind.NOT_FOUND: 404,
    # FAILED_PRECONDITION: the model cannot serve this task; 400 as google.rpc maps it.
    Kind.BAD_MODEL: 400,
    Kind.OVERLOADED: 429,
    Kind.UNAVAILABLE: 503,
    Kind.DEADLINE: 504,
    # Client Closed Request (nginx's 499): the caller went away or the gateway is stopping.
    Kind.CANCELLED: 499,
    Kind.INTERNAL: 500,
    Kind.PERMISSION_DENIED: 403,
    Kind.ALREADY_EXISTS: 409,
    Kind.PRECONDITION: 400,
    Kind.DATA_LOSS: 500,
    Kind.ABORTED: 409,
}


class HttpError(Exception):
    """A failure of the HTTP exchange itself, before the pipeline: its own status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def not_found(message: str) -> HttpError:
    return HttpError(404, "NOT_FOUND", message)


def method_not_allowed(message: str) -> HttpError:
    return HttpError(405, "UNIMPLEMENTED", message)


def unsupported_media_type(message: str) -> HttpError:
    return HttpError(415, "INVALID_ARGUMENT", message)


def body_timeout(message: str) -> HttpError:
    # 408: the client did not send its request in time (504 is the gateway's own deadline).
    return HttpError(408, "DEADLINE_EXCEEDED", message)
