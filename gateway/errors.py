"""The one place where failures become gRPC status codes and messages a person can act on.

Every error a client sees is a GatewayError raised by the gateway's own code or translated
here from an image error or a TF Serving status. Anything else is a bug: the servicer logs
it with its traceback and answers INTERNAL without details.
"""

from __future__ import annotations

import grpc

from gateway.domain import ModelRef
from gateway.images import ImageError


class GatewayError(Exception):
    """An error with the gRPC status code the client gets."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid_argument(message: str) -> GatewayError:
    return GatewayError(grpc.StatusCode.INVALID_ARGUMENT, message)


def failed_precondition(message: str) -> GatewayError:
    return GatewayError(grpc.StatusCode.FAILED_PRECONDITION, message)


def resource_exhausted(message: str) -> GatewayError:
    return GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def from_image_error(error: ImageError) -> GatewayError:
    """Bad or oversized images are the request's fault: INVALID_ARGUMENT.

    Over-limit images are INVALID_ARGUMENT too, not RESOURCE_EXHAUSTED: the same image will
    never pass, so clients and meshes must not retry it.
    """
    return invalid_argument(str(error))


def from_upstream(
    error: grpc.RpcError,
    *,
    target: str,
    model: ModelRef,
) -> GatewayError:
    """Translates a TF Serving (or transport) status, keeping TF Serving's own text."""
    code = error.code()
    details = error.details() or ""
    C = grpc.StatusCode
    if code == C.NOT_FOUND:
        return GatewayError(
            code,
            f"{model.describe()} is not available on TF Serving ({details}); "
            "check DetectRequest.model against the models TF Serving loads",
        )
    if code == C.INVALID_ARGUMENT and "version label" in details:
        return GatewayError(
            code, f"{model.describe()}: {details}; use a label from the TF Serving model config"
        )
    if code in (C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.OUT_OF_RANGE):
        return GatewayError(
            code, f"TF Serving rejected the request for {model.describe()}: {details}"
        )
    if code == C.RESOURCE_EXHAUSTED:
        # grpcio prefixes its own transport messages ("CLIENT: Sent message larger ...").
        if "Sent message larger than max" in details:
            return GatewayError(
                code,
                f"the request to TF Serving is over the gateway's upstream send limit ({details}); "
                "raise GATEWAY_UPSTREAM_MAX_SEND_BYTES or lower GATEWAY_MAX_PIXELS",
            )
        if "Received message larger than max" in details:
            return GatewayError(
                code,
                f"TF Serving's response is over the gateway's upstream receive limit ({details}); "
                "raise GATEWAY_UPSTREAM_MAX_RECEIVE_BYTES",
            )
        return GatewayError(code, f"TF Serving is out of capacity: {details or 'no details'}")
    if code == C.UNAVAILABLE:
        return GatewayError(
            code, f"TF Serving at {target} is unavailable: {details}; retry with backoff"
        )
    if code == C.DEADLINE_EXCEEDED:
        return GatewayError(
            code,
            f"TF Serving did not answer in time for {model.describe()} ({details}); "
            "raise the call's deadline or GATEWAY_UPSTREAM_TIMEOUT",
        )
    if code == C.CANCELLED:
        return GatewayError(code, f"the call to TF Serving was cancelled: {details}")
    return GatewayError(
        C.INTERNAL, f"TF Serving failed on {model.describe()}: {code.name} {details}"
    )
