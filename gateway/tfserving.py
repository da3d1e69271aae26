"""The TF Serving hop: one gRPC channel, the exact TF Serving RPC paths, no TensorFlow.

Messages are our wire-compatible copies (gateway/proto/tfswire); the paths are TF Serving's,
so the other end can be the real `tensorflow_model_server` or the local stand-in.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import grpc
import numpy as np

from gateway import errors, metrics
from gateway.config import Settings
from gateway.detections import BAD_OUTPUTS, REQUIRED_OUTPUTS
from gateway.domain import ModelRef
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tensors import TensorDecodeError, dtype_name, shape_of, to_array

PREDICT = "/tensorflow.serving.PredictionService/Predict"
GET_MODEL_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
GET_MODEL_STATUS = "/tensorflow.serving.ModelService/GetModelStatus"
SIGNATURE = "serving_default"
SIGNATURE_DEF_MAP_TYPE = "tensorflow.serving.SignatureDefMap"
# Wait before describing a version again after GetModelMetadata failed for it.
DESCRIBE_RETRY_SECONDS = 30.0
# Longest wait between two attempts of one call.
RETRY_BACKOFF_CAP = 1.0
# Retries the budget allows before it needs deposits from calls (a burst, e.g. every call
# in flight when a connection drops).
RETRY_RESERVE = 10.0
# Reconnecting to TF Serving: gRPC's default backoff grows to 120 s, which would keep the
# gateway away for minutes after a long outage. Capped at 1 s, the gateway serves again
# within about a second of TF Serving's return, for one connection attempt per second.
RECONNECT_BACKOFF_MS = {"initial": 250, "min": 250, "max": 1000}


class StaleSignature(errors.GatewayError):
    """TF Serving now serves a version whose input dtype differs from the cached signature."""


class InputMode(Enum):
    """How an image is handed to the model, from its signature's single input."""

    PIXELS = "uint8 [1,H,W,3] pixels"  # OD API image_tensor
    FLOAT_PIXELS = "float32 [1,H,W,3] pixels"  # OD API float_image_tensor
    ENCODED = "string [N] encoded images"  # OD API encoded_image_string_tensor


ResponseT = TypeVar("ResponseT")


@dataclass(frozen=True)
class ModelSignature:
    """What the gateway needs to know about one served model version."""

    name: str
    version: int
    input_key: str
    mode: InputMode
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Prediction:
    version: int
    outputs: dict[str, np.ndarray]


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


def read_pem(path: str, setting: str) -> bytes:
    """A certificate or key file named by a setting; OSError naming the setting otherwise."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise OSError(f"cannot read {setting} {path!r}: {e.strerror or e}") from None


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """TLS (and mTLS with a client certificate) to TF Serving; None for plaintext."""
    if not settings.upstream_uses_tls:
        return None
    ca = (
        read_pem(settings.upstream_ca_file, "upstream-ca-file")
        if settings.upstream_ca_file
        else None
    )
    cert = key = None
    if settings.upstream_cert_file:
        cert = read_pem(settings.upstream_cert_file, "upstream-cert-file")
        key = read_pem(settings.upstream_key_file, "upstream-key-file")
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def is_queue_full(error: grpc.RpcError) -> bool:
    """TF Serving's UNAVAILABLE for a full batch queue ("The batch scheduling queue to which
    this task was submitted is full"): backpressure, never retried."""
    details = (error.details() or "").lower()
    return "queue" in details and "full" in details


def is_retryable(error: grpc.RpcError) -> bool:
    """Connection-level failures (TF Serving down, restarting, connection reset): another
    attempt may reach a healthy server. Everything else is the answer."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and not is_queue_full(error)


class RetryBudget:
    """Caps retries to a fraction of calls: each call deposits `ratio` tokens (up to the
    reserve), each retry spends one. In an outage retries stop after the reserve, and then
    add at most `ratio` extra calls per call instead of multiplying the load."""

    def __init__(self, ratio: float, reserve: float = RETRY_RESERVE) -> None:
        self.ratio = ratio
        self.reserve = reserve
        self.tokens = reserve

    def deposit(self) -> None:
        self.tokens = min(self.reserve, self.tokens + self.ratio)

    def withdraw(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def backoff(attempt: int, base: float) -> float:
    """Seconds before attempt `attempt + 1`: full jitter over base * 2^(attempt-1), capped."""
    return random.uniform(0.0, min(RETRY_BACKOFF_CAP, base * 2 ** (attempt - 1)))


def _describe_tensors(infos: dict[str, tfs.TensorInfo]) -> str:
    parts = []
    for key in sorted(infos):
        shape = shape_of(infos[key].tensor_shape)
        shown = "unknown rank" if shape is None else str(list(shape)).replace(" ", "")
        parts.append(f"{key}: {dtype_name(infos[key].dtype)} {shown}")
    return "{" + ", ".join(parts) + "}"


def signature_from_def(name: str, version: int, sig: tfs.SignatureDef) -> ModelSignature:
    """Checks a serving signature is an OD API detection signature and picks the input mode."""
    inputs, outputs = dict(sig.inputs), dict(sig.outputs)
    mode = None
    if len(inputs) == 1:
        key, info = next(iter(inputs.items()))
        shape = shape_of(info.tensor_shape)
        if info.dtype == tfs.DT_STRING and shape is not None and len(shape) == 1:
            mode = InputMode.ENCODED
        elif shape is not None and len(shape) == 4 and shape[3] in (3, -1):
            mode = {tfs.DT_UINT8: InputMode.PIXELS, tfs.DT_FLOAT: InputMode.FLOAT_PIXELS}.get(
                info.dtype
            )
    missing = [k for k in REQUIRED_OUTPUTS if k not in outputs]
    if mode is None or missing:
        raise errors.failed_precondition(
            f"model '{name}' version {version} cannot be used by the gateway: its "
            f"'{SIGNATURE}' signature has inputs {_describe_tensors(inputs)} and outputs "
            f"{_describe_tensors(outputs)}; the gateway needs one image input (uint8 or float32 "
            f"[1,-1,-1,3], or string [-1] of encoded images) and the outputs "
            f"{', '.join(REQUIRED_OUTPUTS)} (a TF Object Detection API export)"
        )
    return ModelSignature(name, version, key, mode, tuple(sorted(outputs)))


def _model_spec(model: ModelRef, signature: bool) -> tfs.ModelSpec:
    spec = tfs.ModelSpec(name=model.name, signature_name=SIGNATURE if signature else "")
    if model.version is not None:
        spec.version.value = model.version
    elif model.label is not None:
        spec.version_label = model.label
    return spec


def request_envelope(model: ModelRef) -> bytes:
    """A serialized PredictRequest without inputs: model spec, signature and output filter.

    gateway.inputs appends the input tensor to it (protobuf fields may come in any order).
    """
    request = tfs.PredictRequest(
        model_spec=_model_spec(model, signature=True), output_filter=list(REQUIRED_OUTPUTS)
    )
    return request.SerializeToString()


class TFServingClient:
    """Async calls to TF Serving with deadlines, plus a cache of model signatures.

    Signatures are cached per (name, version). Each Predict response names the version that
    served it; a version not seen before is described with GetModelMetadata in the background,
    and requests use its signature from then on. Metadata is never fetched per request, which
    matters with round_robin over pods that serve different versions during a rollout.
    """

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
        # Predict requests arrive serialized (gateway.inputs writes the pixels into them).
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
        # Signatures by (model name, version): a version's signature never changes.
        self._signatures: dict[tuple[str, int], ModelSignature] = {}
        # Per requested model (name + version/label/latest): the version that served it last,
        # and the signature fetched for it last.
        self._served: dict[ModelRef, int] = {}
        self._latest: dict[ModelRef, ModelSignature] = {}
        self._locks: dict[ModelRef, asyncio.Lock] = {}
        self._describing: set[tuple[str, int]] = set()
        self._describe_after: dict[tuple[str, int], float] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await self._channel.close()

    def _error(self, e: grpc.RpcError, model: ModelRef) -> errors.GatewayError:
        return errors.from_upstream(e, target=self.target, model=model)

    async def _call(
        self,
        rpc: str,
        method: Callable[..., Awaitable[ResponseT]],
        request: object,
        timeout: float,
    ) -> ResponseT:
        """One idempotent call with retries: connection-level UNAVAILABLE only, with jittered
        exponential backoff, within `timeout` overall and the retry budget."""
        deadline = time.monotonic() + timeout
        self._budget.deposit()
        attempt = 1
        while True:
            try:
                return await method(request, timeout=max(deadline - time.monotonic(), 0.001))
            except grpc.RpcError as e:
                if attempt >= self._settings.upstream_max_attempts or not is_retryable(e):
                    raise
                delay = backoff(attempt, self._settings.upstream_retry_backoff)
                if time.monotonic() + delay >= deadline:
                    raise
                if not self._budget.withdraw():
                    metrics.UPSTREAM_RETRIES.labels(rpc, "budget_exhausted").inc()
                    raise
                metrics.UPSTREAM_RETRIES.labels(rpc, "retried").inc()
            await asyncio.sleep(delay)
            attempt += 1

    async def signature(self, model: ModelRef, timeout: float) -> ModelSignature:
        """The signature to build this request's input with; metadata is fetched only when
        nothing is known about the model yet."""
        cached = self._known(model)
        if cached is not None:
            return cached
        lock = self._locks.setdefault(model, asyncio.Lock())
        try:
            async with lock:  # one metadata call per model, however many requests wait
                cached = self._known(model)
                if cached is None:
                    cached = await self._fetch_signature(model, timeout)
                    self._signatures[(model.name, cached.version)] = cached
                    self._latest[model] = cached
                return cached
        finally:
            if model not in self._latest:
                # Unknown model names must not pile up locks (clients choose the names).
                self._locks.pop(model, None)

    def _known(self, model: ModelRef) -> ModelSignature | None:
        if model.version is not None:
            return self._signatures.get((model.name, model.version))
        served = self._served.get(model)
        if served is not None and (model.name, served) in self._signatures:
            return self._signatures[(model.name, served)]
        # The version that served last is still being described: its predecessor's
        # signature is almost always the same, and a dtype change is caught (StaleSignature).
        return self._latest.get(model)

    def forget(self, model: ModelRef) -> None:
        self._latest.pop(model, None)
        self._served.pop(model, None)

    def _observe(self, model: ModelRef, version: int) -> None:
        """Notes the version that served `model`; describes a new one in the background."""
        self._served[model] = version
        key = (model.name, version)
        if key in self._signatures or key in self._describing:
            return
        if time.monotonic() < self._describe_after.get(key, 0.0):
            return
        self._describing.add(key)
        task = asyncio.create_task(self._describe(model.name, version))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _describe(self, name: str, version: int) -> None:
        try:
            signature = await self._fetch_signature(
                ModelRef(name, version=version), self._settings.upstream_timeout
            )
            self._signatures[(name, version)] = signature
        except errors.GatewayError:
            # E.g. NOT_FOUND from a pod that does not have this version yet (mid-rollout,
            # round robin). Try again later, not on every request: the extra call would
            # shift round_robin's rotation and skew which pods get the Predicts.
            self._describe_after[(name, version)] = time.monotonic() + DESCRIBE_RETRY_SECONDS
        finally:
            self._describing.discard((name, version))

    async def _fetch_signature(self, model: ModelRef, timeout: float) -> ModelSignature:
        request = tfs.GetModelMetadataRequest(
            model_spec=_model_spec(model, signature=False), metadata_field=["signature_def"]
        )
        try:
            response = await self._call("GetModelMetadata", self._metadata, request, timeout)
        except grpc.RpcError as e:
            raise self._error(e, model) from None
        version = response.model_spec.version.value
        packed = response.metadata.get("signature_def")
        if packed is None or not packed.type_url.endswith("/" + SIGNATURE_DEF_MAP_TYPE):
            raise errors.failed_precondition(
                f"TF Serving returned no signature_def metadata for {model.describe()}"
            )
        sig_map = tfs.SignatureDefMap.FromString(packed.value)
        if SIGNATURE not in sig_map.signature_def:
            raise errors.failed_precondition(
                f"model '{model.name}' version {version} has no '{SIGNATURE}' signature "
                f"(it has {sorted(sig_map.signature_def)})"
            )
        return signature_from_def(model.name, version, sig_map.signature_def[SIGNATURE])

    async def predict(self, model: ModelRef, request: bytes, timeout: float) -> Prediction:
        """Sends a serialized PredictRequest (see request_envelope) for `model`."""
        try:
            # Predict is retried: inference has no side effects in TF Serving, so a repeat
            # costs compute only, and the budget bounds that (README "Reliability").
            response = await self._call("Predict", self._predict, request, timeout)
        except grpc.RpcError as e:
            error = self._error(e, model)
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT and "Expects arg[" in (
                e.details() or ""
            ):
                # The served version changed to one with another input dtype: the caller
                # refreshes the signature and tries once more.
                self.forget(model)
                raise StaleSignature(error.code, error.message) from None
            raise error from None
        version = response.model_spec.version.value
        self._observe(model, version)
        try:
            outputs = {k: to_array(v) for k, v in response.outputs.items()}
        except TensorDecodeError as e:
            BAD_OUTPUTS.report(model.name, version, str(e))
            raise errors.failed_precondition(
                f"cannot read the output of model '{model.name}' version {version}: {e}"
            ) from None
        return Prediction(version, outputs)

    async def model_available(self, name: str, timeout: float) -> bool:
        """True when TF Serving reports some version of the model AVAILABLE."""
        request = tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name=name))
        try:
            response = await self._status(request, timeout=timeout)
        except grpc.RpcError:
            return False
        return any(
            s.state == tfs.ModelVersionStatus.AVAILABLE for s in response.model_version_status
        )
