"""Domain errors: what went wrong, as a kind and a message a person can act on.

No transport words here. Each front door maps kinds to its own codes in one table
(gateway/frontends/grpc/status.py, gateway/frontends/http/status.py). `Kind.code` is the
canonical status name (google.rpc.Code) that the request log and the metrics record, the
same whichever door the request came in by.

Anything that is not a GatewayError is a bug: the pipeline logs it with its traceback and
answers INTERNAL without details.
"""

from __future__ import annotations

from enum import Enum


class Kind(Enum):
    """What kind of failure (see `code` for its canonical status name)."""

    # The request is wrong and the same request will never succeed: bad fields, an empty or
    # undecodable image, or a request TF Serving refused as invalid.
    INVALID_INPUT = "invalid_input"
    # The image is over a size or pixel limit. Never retried either: it fails again.
    TOO_LARGE = "too_large"
    # TF Serving refused a value as out of range.
    OUT_OF_RANGE = "out_of_range"
    # No such model, version or label.
    NOT_FOUND = "not_found"
    # The model cannot be used for this task (its signature or outputs are not what the task
    # needs, or it is configured for another task).
    BAD_MODEL = "bad_model"
    # The gateway or TF Serving is full: retry with backoff.
    OVERLOADED = "overloaded"
    # TF Serving cannot be reached.
    UNAVAILABLE = "unavailable"
    # The caller's deadline (or the gateway's upstream timeout) passed.
    DEADLINE = "deadline"
    # The caller or the gateway's shutdown cancelled the work.
    CANCELLED = "cancelled"
    # A bug in the gateway, or a TF Serving failure with no better kind.
    INTERNAL = "internal"
    # The caller may not do this (a batch input or output outside the allowed prefixes).
    PERMISSION_DENIED = "permission_denied"
    # What the request would create exists already (a request_id reused with other fields).
    ALREADY_EXISTS = "already_exists"
    # Something must change before the request can succeed (an output prefix that holds a
    # job started with other arguments); models that cannot serve a task are BAD_MODEL.
    PRECONDITION = "precondition"
    # Data that cannot be read back whole (a damaged TFRecord record).
    DATA_LOSS = "data_loss"
    # The work was stopped by a conflict with something else (a Kubernetes Job deleted
    # outside the API); retrying may succeed.
    ABORTED = "aborted"
    # The request's work is over a cap the operator set (gateway.domain.Cost: more
    # detections, mask pixels or answer bytes than the model's [limits] allow). Never retried
    # either: the same request is refused again; the message names the setting.
    TOO_COSTLY = "too_costly"
    # (Declared last: RESOURCE_EXHAUSTED read back from another server is OVERLOADED.)

    @property
    def code(self) -> str:
        """The canonical status name (google.rpc.Code) recorded in logs and metrics."""
        return _CODES[self]

    @property
    def per_item(self) -> bool:
        """True when the failure concerns one image only, so a stream of images goes on;
        the other kinds concern the model, the service or the call, and end a stream."""
        return self in _PER_ITEM


_CODES = {
    Kind.INVALID_INPUT: "INVALID_ARGUMENT",
    Kind.TOO_LARGE: "INVALID_ARGUMENT",
    Kind.TOO_COSTLY: "RESOURCE_EXHAUSTED",
    Kind.OUT_OF_RANGE: "OUT_OF_RANGE",
    Kind.NOT_FOUND: "NOT_FOUND",
    Kind.BAD_MODEL: "FAILED_PRECONDITION",
    Kind.OVERLOADED: "RESOURCE_EXHAUSTED",
    Kind.UNAVAILABLE: "UNAVAILABLE",
    Kind.DEADLINE: "DEADLINE_EXCEEDED",
    Kind.CANCELLED: "CANCELLED",
    Kind.INTERNAL: "INTERNAL",
    Kind.PERMISSION_DENIED: "PERMISSION_DENIED",
    Kind.ALREADY_EXISTS: "ALREADY_EXISTS",
    Kind.PRECONDITION: "FAILED_PRECONDITION",
    Kind.DATA_LOSS: "DATA_LOSS",
    Kind.ABORTED: "ABORTED",
}
_PER_ITEM = frozenset(
    {
        Kind.INVALID_INPUT,
        Kind.TOO_LARGE,
        Kind.TOO_COSTLY,
        Kind.OUT_OF_RANGE,
        Kind.INTERNAL,
        Kind.DATA_LOSS,
    }
)


class GatewayError(Exception):
    """A failure with its kind and a message for the caller; `retry_after`: seconds after
    which a retry may succeed, when the gateway knows (an OVERLOADED caller over its quota);
    the doors send it as google.rpc.RetryInfo and Retry-After."""

    def __init__(self, kind: Kind, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after

    @property
    def code(self) -> str:
        return self.kind.code


def invalid_input(message: str) -> GatewayError:
    return GatewayError(Kind.INVALID_INPUT, message)


def bad_model(message: str) -> GatewayError:
    return GatewayError(Kind.BAD_MODEL, message)


def too_costly(message: str) -> GatewayError:
    return GatewayError(Kind.TOO_COSTLY, message)


def internal(request_id: str) -> GatewayError:
    """A bug's answer to the caller (its traceback goes to the log, never to the caller)."""
    return GatewayError(
        Kind.INTERNAL, f"internal error in the gateway; quote request id {request_id}"
    )


def overloaded(message: str, retry_after: float | None = None) -> GatewayError:
    return GatewayError(Kind.OVERLOADED, message, retry_after)
