"""The TF Serving hop: one gRPC channel, the exact TF Serving RPC paths, no TensorFlow.

Task-agnostic: Predict with a request built elsewhere, GetModelMetadata (through the
signature cache), GetModelStatus; retries within the caller's deadline and a retry budget
(gateway.upstream.retries); TF Serving's statuses translated into domain errors
(gateway.upstream.statuses). Messages are our wire-compatible copies
(gateway/proto/tfswire); the paths are TF Serving's, so the other end can be the real
`tensorflow_model_server` or the local stand-in.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, TypeVar

import grpc

from gateway import metrics
from gateway.config import Settings
from gateway.domain import ModelRef
from gateway.errors import GatewayError, Kind
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tls import TLS
from gateway.upstream.retries import RetryBudget, backoff, is_retryable
from gateway.upstream.signatures import (
    SIGNATURE,
    Signature,
    SignatureCache,
    signature_from_metadata,
)
from gateway.upstream.statuses import from_upstream
from gateway.upstream.tensors import OutputTensor, TensorDecodeError

PREDICT = "/tensorflow.serving.PredictionService/Predict"
GET_MODEL_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
GET_MODEL_STATUS = "/tensorflow.serving.ModelService/GetModelStatus"
# Reconnecting to TF Serving: gRPC's default backoff grows to 120 s, which would keep the
# gateway away for minutes after a long outage. Capped at 1 s, the gateway serves again
# within about a second of TF Serving's return, for one connection attempt per second.
RECONNECT_BACKOFF_MS = {"initial": 250, "min": 250, "max": 1000}


class StaleSignature(GatewayError):
    """TF Serving now serves a version whose input dtype differs from the cached signature."""


class UnreadableOutput(GatewayError):
    """TF Serving answered with an output tensor that cannot be decoded."""

    def __init__(self, model: str, version: int, problem: str) -> None:
        super().__init__(
            Kind.BAD_MODEL,
            f"cannot read the output of model '{model}' version {version}: {problem}",
        )
        self.model = model
        self.version = version
        self.problem = problem


ResponseT = TypeVar("ResponseT")
# gRPC metadata sent along with a call: (key, value) pairs.
Metadata = tuple[tuple[str, str], ...]


class Prediction(NamedTuple):
    version: int
    outputs: dict[str, OutputTensor]  # checked; decoded when a task reads them


def channel_options(settings: Settings) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", settings.upstream_send_bytes),
        ("grpc.max_receive_message_length", settings.upstream_max_receive_bytes),
        # Detect a dead TF Serving pod behind a silent network path within ~30 s.
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
    ]
    options += [
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["initial"]),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["min"]),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["max"]),
    ]
    if settings.upstream_server_name:
        options.append(("grpc.ssl_target_name_override", settings.upstream_server_name))
    if settings.upstream_lb == "round_robin":
        config: dict[str, object] = {"loadBalancingConfig": [{"round_robin": {}}]}
        options.append(("grpc.service_config", json.dumps(config)))
    return options


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """TLS (and mTLS with a client certificate) to TF Serving; None for plaintext."""
    if not settings.upstream_uses_tls:
        return None
    files = TLS(
        settings.upstream_ca_file or None,
        settings.upstream_cert_file or None,
        settings.upstream_key_file or None,
    )
    return files.credentials(flags="upstream-")


def _model_spec(model: ModelRef, signature: str = "") -> tfs.ModelSpec:
    spec = tfs.ModelSpec(name=model.name, signature_name=signature)
    if model.version is not None:
        spec.version.value = model.version
    elif model.label is not None:
        spec.version_label = model.label
    return spec


def request_envelope(
    model: ModelRef, output_filter: Sequence[str], signature: str = SIGNATURE
) -> bytes:
    """A serialized PredictRequest without inputs: model spec, signature and output filter.

    gateway.upstream.wire appends the input tensor to it (protobuf fields may come in any
    order).
    """
    request = tfs.PredictRequest(
        model_spec=_model_spec(model, signature), output_filter=list(output_filter)
    )
    return request.SerializeToString()


class TFServingClient:
    """Async calls to TF Serving with deadlines and retries, plus the signature cache."""

    def __init__(self, settings: Settings) -> None:
        self.target = settings.upstream
        self._settings = settings
        credentials = channel_credentials(settings)
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(
                settings.upstream, options=channel_options(settings)
            )
        else:
            self._channel = grpc.aio.secure_channel(
                settings.upstream, credentials, options=channel_options(settings)
            )
        self._budget = RetryBudget(settings.upstream_retry_budget)
        # Predict requests arrive serialized (gateway.upstream.wire writes the pixels in).
        self._predict = self._channel.unary_unary(
            PREDICT,
            request_serializer=None,
            response_deserializer=tfs.PredictResponse.FromString,
        )
        self._metadata = self._channel.unary_unary(
            GET_MODEL_METADATA,
            request_serializer=tfs.GetModelMetadataRequest.SerializeToString,
            response_deserializer=tfs.GetModelMetadataResponse.FromString,
        )
        self._status = self._channel.unary_unary(
            GET_MODEL_STATUS,
            request_serializer=tfs.GetModelStatusRequest.SerializeToString,
            response_deserializer=tfs.GetModelStatusResponse.FromString,
        )
        self.signatures = SignatureCache(self._fetch_signature, settings.upstream_timeout)
        # The signature each model is called with, where the model config names one other
        # than serving_default (set by the app from the model registry).
        self.signature_names: dict[str, str] = {}

    async def close(self) -> None:
        await self._channel.close()

    def _error(self, exc: grpc.RpcError, model: ModelRef) -> GatewayError:
        return from_upstream(exc, target=self.target, model=model)

    async def _call(
        self,
        rpc: str,
        method: Callable[..., Awaitable[ResponseT]],
        request: object,
        timeout: float,
        metadata: Metadata = (),
    ) -> ResponseT:
        """One idempotent call with retries: UNAVAILABLE except TF Serving's queue-full, with
        jittered exponential backoff, within `timeout` overall and the retry budget."""
        started = time.monotonic()
        self._budget.deposit()
        try:
            return await method(request, timeout=timeout, metadata=metadata or None)
        except grpc.RpcError as exc:
            return await self._retry(rpc, method, request, started + timeout, metadata, exc)

    async def _retry(
        self,
        rpc: str,
        method: Callable[..., Awaitable[ResponseT]],
        request: object,
        deadline: float,
        metadata: Metadata,
        error: grpc.RpcError,
    ) -> ResponseT:
        """Attempts after the first one failed with `error` (see _call)."""
        attempt = 1
        while True:
            if attempt >= self._settings.upstream_max_attempts or not is_retryable(error):
                raise error
            delay = backoff(attempt, self._settings.upstream_retry_backoff)
            if time.monotonic() + delay >= deadline:
                raise error
            if not self._budget.withdraw():
                metrics.UPSTREAM_RETRIES.labels(rpc, "budget_exhausted").inc()
                raise error
            metrics.UPSTREAM_RETRIES.labels(rpc, "retried").inc()
            await asyncio.sleep(delay)
            attempt += 1
            try:
                return await method(
                    request,
                    timeout=max(deadline - time.monotonic(), 0.001),
                    metadata=metadata or None,
                )
            except grpc.RpcError as exc:
                error = exc

    async def signature(
        self, model: ModelRef, timeout: float, metadata: Metadata = ()
    ) -> Signature:
        """The signature to build this request's input with (cached; see SignatureCache);
        `metadata` (trace headers) goes along when it has to be fetched."""
        return await self.signatures.get(model, timeout, metadata)

    async def _fetch_signature(
        self, model: ModelRef, timeout: float, metadata: Metadata = ()
    ) -> Signature:
        request = tfs.GetModelMetadataRequest(
            model_spec=_model_spec(model), metadata_field=["signature_def"]
        )
        try:
            response = await self._call(
                "GetModelMetadata", self._metadata, request, timeout, metadata
            )
        except grpc.RpcError as exc:
            raise self._error(exc, model) from None
        return signature_from_metadata(
            model, response, self.signature_names.get(model.name, SIGNATURE)
        )

    async def predict(
        self, model: ModelRef, request: bytes, timeout: float, metadata: Metadata = ()
    ) -> Prediction:
        """Sends a serialized PredictRequest (see request_envelope) for `model`; `metadata`
        goes along (trace context)."""
        try:
            # Predict is retried: inference has no side effects in TF Serving, so a repeat
            # costs compute only, and the budget bounds that (README "Reliability").
            response = await self._call("Predict", self._predict, request, timeout, metadata)
        except grpc.RpcError as exc:
            error = self._error(exc, model)
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "Expects arg[" in (
                exc.details() or ""
            ):
                # The served version changed to one with another input dtype: the caller
                # refreshes the signature and tries once more.
                self.signatures.forget(model)
                raise StaleSignature(error.kind, error.message) from None
            raise error from None
        version = response.model_spec.version.value
        self.signatures.observe(model, version)
        try:
            tensors = response.outputs  # (keys then lookups: faster than the map's items())
            outputs = {key: OutputTensor(tensors[key]) for key in tensors}
        except TensorDecodeError as exc:
            raise UnreadableOutput(model.name, version, str(exc)) from None
        return Prediction(version, outputs)

    async def model_available(self, name: str, timeout: float) -> bool:
        """True when TF Serving reports some version of the model AVAILABLE."""
        request = tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name=name))
        try:
            response = await self._status(request, timeout=timeout)
        except grpc.RpcError:
            return False
        return any(
            status.state == tfs.ModelVersionStatus.AVAILABLE
            for status in response.model_version_status
        )

    async def model_status(self, model: ModelRef, timeout: float) -> tfs.GetModelStatusResponse:
        """TF Serving's status of a model's versions (all, or the one named by version or
        label); GatewayError (NOT_FOUND for an unknown model) otherwise. Retried like the
        other calls: it only reads."""
        request = tfs.GetModelStatusRequest(model_spec=_model_spec(model))
        try:
            response: tfs.GetModelStatusResponse = await self._call(
                "GetModelStatus", self._status, request, timeout
            )
        except grpc.RpcError as exc:
            raise self._error(exc, model) from None
        return response
