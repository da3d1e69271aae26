"""Model signatures as TF Serving describes them, cached per (model, version); task-agnostic.

Signatures are cached per (name, version): a version's signature never changes. Each Predict
response names the version that served it; a version not seen before is described with
GetModelMetadata in the background, and requests use its signature from then on. Metadata is
never fetched per request, which matters with round_robin over pods that serve different
versions during a rollout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gateway import errors
from gateway.domain import ModelRef
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.tensors import dtype_name, shape_of

SIGNATURE = "serving_default"
SIGNATURE_DEF_MAP_TYPE = "tensorflow.serving.SignatureDefMap"
# Wait before describing a version again after GetModelMetadata failed for it.
DESCRIBE_RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class TensorSpec:
    dtype: int  # DataType number (tfs.DT_*)
    shape: tuple[int, ...] | None  # -1 for unknown dimensions; None for an unknown rank

    def describe(self) -> str:
        shown = "unknown rank" if self.shape is None else str(list(self.shape)).replace(" ", "")
        return f"{dtype_name(self.dtype)} {shown}"


@dataclass(frozen=True)
class Signature:
    """The signature of one model version the gateway calls (`serving_default` unless the
    model config names another)."""

    model: str
    version: int
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    name: str = SIGNATURE

    def describe(self) -> str:
        """Inputs and outputs for error messages: `inputs {...} and outputs {...}`."""
        return f"inputs {_describe(self.inputs)} and outputs {_describe(self.outputs)}"


def _describe(specs: Mapping[str, TensorSpec]) -> str:
    return "{" + ", ".join(f"{key}: {specs[key].describe()}" for key in sorted(specs)) + "}"


def signature_from_metadata(
    model: ModelRef, response: tfs.GetModelMetadataResponse, name: str = SIGNATURE
) -> Signature:
    """Signature `name` from a GetModelMetadata response (BAD_MODEL if there is none)."""
    version = response.model_spec.version.value
    packed = response.metadata.get("signature_def")
    if packed is None or not packed.type_url.endswith("/" + SIGNATURE_DEF_MAP_TYPE):
        raise errors.bad_model(
            f"TF Serving returned no signature_def metadata for {model.describe()}"
        )
    sig_map = tfs.SignatureDefMap.FromString(packed.value)
    if name not in sig_map.signature_def:
        names = sorted(key for key in sig_map.signature_def if not key.startswith("__"))
        raise errors.bad_model(
            f"model '{model.name}' version {version} has no '{name}' signature (it has "
            f"{names}); set signature = '<name>' for it in the model config"
        )
    sig = sig_map.signature_def[name]
    return Signature(
        model.name,
        version,
        {
            key: TensorSpec(info.dtype, shape_of(info.tensor_shape))
            for key, info in sig.inputs.items()
        },
        {
            key: TensorSpec(info.dtype, shape_of(info.tensor_shape))
            for key, info in sig.outputs.items()
        },
        name,
    )


# (model, timeout, metadata to send: the caller's trace headers) -> its signature
Fetch = Callable[[ModelRef, float, tuple[tuple[str, str], ...]], Awaitable[Signature]]


class SignatureCache:
    """The signature to build each request with, fetched only when nothing is known."""

    def __init__(self, fetch: Fetch, describe_timeout: float) -> None:
        self._fetch = fetch
        self._describe_timeout = describe_timeout
        self._signatures: dict[tuple[str, int], Signature] = {}
        # Per requested model (name + version/label/latest): the version that served it last,
        # and the signature fetched for it last.
        self._served: dict[ModelRef, int] = {}
        self._latest: dict[ModelRef, Signature] = {}
        self._locks: dict[ModelRef, asyncio.Lock] = {}
        self._describing: set[tuple[str, int]] = set()
        self._describe_after: dict[tuple[str, int], float] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def get(
        self, model: ModelRef, timeout: float, trace: tuple[tuple[str, str], ...] = ()
    ) -> Signature:
        cached = self.known(model)
        if cached is not None:
            return cached
        lock = self._locks.setdefault(model, asyncio.Lock())
        try:
            async with lock:  # one metadata call per model, however many requests wait
                cached = self.known(model)
                if cached is None:
                    cached = await self._fetch(model, timeout, trace)
                    self._signatures[(model.name, cached.version)] = cached
                    self._latest[model] = cached
                return cached
        finally:
            if model not in self._latest:
                # Unknown model names must not pile up locks (clients choose the names).
                self._locks.pop(model, None)

    def known(self, model: ModelRef) -> Signature | None:
        """The signature to use for `model` without asking TF Serving, if there is one."""
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

    def observe(self, model: ModelRef, version: int) -> None:
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
            signature = await self._fetch(
                ModelRef(name, version=version), self._describe_timeout, ()
            )
            self._signatures[(name, version)] = signature
        except errors.GatewayError:
            # E.g. NOT_FOUND from a pod that does not have this version yet (mid-rollout,
            # round robin). Try again later, not on every request: the extra call would
            # shift round_robin's rotation and skew which pods get the Predicts.
            self._describe_after[(name, version)] = time.monotonic() + DESCRIBE_RETRY_SECONDS
        finally:
            self._describing.discard((name, version))
