"""TF Serving's statuses (and the transport's) as domain errors, keeping TF Serving's own text
and saying what to do."""

from __future__ import annotations

import grpc

from gateway.domain import ModelRef
from gateway.errors import GatewayError, Kind


def from_upstream(error: grpc.RpcError, *, target: str, model: ModelRef) -> GatewayError:
    """Translates a TF Serving (or transport) status, keeping TF Serving's own text."""
    code = error.code()
    details = error.details() or ""
    Code = grpc.StatusCode
    if code == Code.NOT_FOUND:
        return GatewayError(
            Kind.NOT_FOUND,
            f"{model.describe()} is not available on TF Serving ({details}); "
            "check the request's model against the models TF Serving loads",
        )
    if code == Code.INVALID_ARGUMENT and "version label" in details:
        return GatewayError(
            Kind.INVALID_INPUT,
            f"{model.describe()}: {details}; use a label from the TF Serving model config",
        )
    if code == Code.INVALID_ARGUMENT and "Could not parse example input" in details:
        # A tf_example signature (OD API, Model Garden) sent the bare image: the model's
        # config is wrong, not the caller's image (serving/local/FACTS.md, unparsable_example).
        return GatewayError(
            Kind.BAD_MODEL,
            f"{model.describe()} takes serialized tf.train.Example protos, not bare images "
            f"(TF Serving: {details[:120]}); set input.string_encoding = 'tf_example' for it "
            "in the model config",
        )
    rejected = {
        Code.INVALID_ARGUMENT: Kind.INVALID_INPUT,
        Code.FAILED_PRECONDITION: Kind.BAD_MODEL,
        Code.OUT_OF_RANGE: Kind.OUT_OF_RANGE,
    }
    if code in rejected:
        return GatewayError(
            rejected[code], f"TF Serving rejected the request for {model.describe()}: {details}"
        )
    if code == Code.RESOURCE_EXHAUSTED:
        # grpcio prefixes its own transport messages ("CLIENT: Sent message larger ...").
        if "Sent message larger than max" in details:
            return GatewayError(
                Kind.OVERLOADED,
                f"the request to TF Serving is over the gateway's upstream send limit ({details}); "
                "raise GATEWAY_UPSTREAM_MAX_SEND_BYTES or lower GATEWAY_MAX_PIXELS",
            )
        if "Received message larger than max" in details:
            return GatewayError(
                Kind.OVERLOADED,
                f"TF Serving's response is over the gateway's upstream receive limit ({details}); "
                "raise GATEWAY_UPSTREAM_MAX_RECEIVE_BYTES",
            )
        return GatewayError(
            Kind.OVERLOADED, f"TF Serving is out of capacity: {details or 'no details'}"
        )
    if code == Code.UNAVAILABLE:
        return GatewayError(
            Kind.UNAVAILABLE,
            f"TF Serving at {target} is unavailable: {details}; retry with backoff",
        )
    if code == Code.DEADLINE_EXCEEDED:
        return GatewayError(
            Kind.DEADLINE,
            f"TF Serving did not answer in time for {model.describe()} ({details}); "
            "raise the call's deadline or GATEWAY_UPSTREAM_TIMEOUT",
        )
    if code == Code.CANCELLED:
        return GatewayError(Kind.CANCELLED, f"the call to TF Serving was cancelled: {details}")
    return GatewayError(
        Kind.INTERNAL, f"TF Serving failed on {model.describe()}: {code.name} {details}"
    )
