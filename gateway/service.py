"""detection.v1.DetectionService: the RPC methods, thin over the detection pipeline.

Per image: validate the request -> read the model's signature (cached) -> build the input
tensor in a worker thread -> Predict on TF Serving -> map the outputs. Each image is counted
in the metrics and logged as one JSON line, whatever its outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

import grpc

from gateway import errors, images, metrics
from gateway.config import Settings
from gateway.converters import Query, to_query, to_result
from gateway.detections import BAD_OUTPUTS, OutputError, map_detections
from gateway.domain import DetectionOutcome
from gateway.inputs import ModelInput, build_input, encoded_input
from gateway.labelmap import LabelMap
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.tfserving import (
    InputMode,
    ModelSignature,
    StaleSignature,
    TFServingClient,
    request_envelope,
)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DetectionService"].full_name
request_log = logging.getLogger("gateway.request")
log = logging.getLogger("gateway.service")


@dataclass
class Timings:
    decode: float = 0.0
    upstream: float = 0.0


class ConcurrencyLimit:
    """Counts images in flight; refuses more than the limit instead of queueing them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def acquire(self) -> None:
        if self.in_flight >= self.limit:
            raise errors.resource_exhausted(
                f"the gateway is working on its limit of {self.limit} images; retry with "
                "backoff, add gateway replicas or raise GATEWAY_MAX_CONCURRENT_REQUESTS"
            )
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1


def _metadata_request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and isinstance(value, str):
            return value
    return ""


class DetectionService(pb_grpc.DetectionServiceServicer):
    def __init__(
        self,
        settings: Settings,
        client: TFServingClient,
        label_maps: Mapping[str, LabelMap],
        executor: Executor,
    ) -> None:
        self._settings = settings
        self._client = client
        self._label_maps = label_maps
        self._executor = executor
        self._limit = ConcurrencyLimit(settings.max_concurrent_requests)
        self._image_limits = images.ImageLimits(settings.max_image_bytes, settings.max_pixels)

    async def Detect(
        self, request: pb.DetectRequest, context: grpc.aio.ServicerContext
    ) -> pb.DetectionResult:
        request_id = request.request_id or _metadata_request_id(context) or uuid.uuid4().hex
        try:
            return await self._process("Detect", request, request_id, context)
        except errors.GatewayError as e:
            context.set_trailing_metadata((("x-request-id", request_id),))
            await context.abort(e.code, e.message)
            raise  # unreachable: abort raises

    async def DetectStream(
        self, request_iterator: AsyncIterator[pb.DetectRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DetectionResult]:
        stream_id = _metadata_request_id(context) or uuid.uuid4().hex
        pending: deque[asyncio.Task[pb.DetectionResult]] = deque()
        try:
            index = 0
            async for request in request_iterator:
                request_id = request.request_id or f"{stream_id}-{index}"
                index += 1
                work = self._process("DetectStream", request, request_id, context)
                pending.append(asyncio.ensure_future(work))
                # Back-pressure: with a full window, stop reading frames until the oldest
                # result has been handed to gRPC (which waits on the client's flow control).
                if len(pending) >= self._settings.stream_window:
                    yield await pending.popleft()
            while pending:
                yield await pending.popleft()
        except errors.GatewayError as e:
            await context.abort(e.code, e.message)
        finally:
            for left in pending:
                left.cancel()

    async def _process(
        self,
        method: str,
        request: pb.DetectRequest,
        request_id: str,
        context: grpc.aio.ServicerContext,
    ) -> pb.DetectionResult:
        """One image end to end; counts and logs it; raises GatewayError on failure."""
        started = time.perf_counter()
        timings = Timings()
        code = grpc.StatusCode.OK
        query: Query | None = None
        outcome: DetectionOutcome | None = None
        metrics.IN_FLIGHT.inc()
        try:
            self._limit.acquire()
            try:
                query = to_query(request, self._settings)
                outcome = await self._detect(query, request_id, context, timings)
            finally:
                self._limit.release()
            return to_result(outcome)
        except errors.GatewayError as e:
            code = e.code
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception:
            code = grpc.StatusCode.INTERNAL
            log.exception("unexpected error", extra={"fields": {"request_id": request_id}})
            raise errors.GatewayError(
                code, f"internal error in the gateway; quote request id {request_id}"
            ) from None
        finally:
            metrics.IN_FLIGHT.dec()
            total = time.perf_counter() - started
            self._record(
                method, code, request_id, query, outcome, timings, total, len(request.image)
            )

    def _timeout(self, context: grpc.aio.ServicerContext) -> float:
        """Seconds left for a TF Serving call: the client's deadline, capped by ours."""
        remaining = context.time_remaining()
        if remaining is None:
            return self._settings.upstream_timeout
        if remaining <= 0:
            raise errors.GatewayError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed in the gateway"
            )
        return min(remaining, self._settings.upstream_timeout)

    async def _build_input(
        self, query: Query, signature: ModelSignature, timings: Timings
    ) -> ModelInput:
        started = time.perf_counter()
        envelope = request_envelope(query.model)
        try:
            if signature.mode is InputMode.ENCODED:
                # Forwarding the caller's bytes needs only their header: no thread hop.
                forwarded = encoded_input(
                    query.image, signature.input_key, envelope, self._image_limits
                )
                if forwarded is not None:
                    return forwarded
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executor,
                build_input,
                query.image,
                signature.mode,
                signature.input_key,
                envelope,
                self._image_limits,
            )
        except images.ImageError as e:
            raise errors.from_image_error(e) from None
        finally:
            timings.decode += time.perf_counter() - started

    async def _detect(
        self,
        query: Query,
        request_id: str,
        context: grpc.aio.ServicerContext,
        timings: Timings,
    ) -> DetectionOutcome:
        for attempt in (1, 2):
            signature = await self._client.signature(query.model, self._timeout(context))
            model_input = await self._build_input(query, signature, timings)
            started = time.perf_counter()
            try:
                prediction = await self._client.predict(
                    query.model, model_input.request, self._timeout(context)
                )
                break
            except StaleSignature:
                if attempt == 2:
                    raise
            finally:
                timings.upstream += time.perf_counter() - started
        try:
            detections = map_detections(
                prediction.outputs,
                width=model_input.width,
                height=model_input.height,
                label_map=self._label_maps.get(query.model.name, LabelMap()),
                min_score=query.min_score,
                max_detections=query.max_detections,
                transform=model_input.transform,
            )
        except OutputError as e:
            BAD_OUTPUTS.report(query.model.name, prediction.version, str(e))
            raise errors.failed_precondition(
                f"model '{query.model.name}' version {prediction.version} gave unusable "
                f"outputs: {e}"
            ) from None
        return DetectionOutcome(
            detections=detections,
            image_width=model_input.width,
            image_height=model_input.height,
            model_name=query.model.name,
            model_version=prediction.version,
            request_id=request_id,
        )

    def _record(
        self,
        method: str,
        code: grpc.StatusCode,
        request_id: str,
        query: Query | None,
        outcome: DetectionOutcome | None,
        timings: Timings,
        total: float,
        image_bytes: int,
    ) -> None:
        metrics.REQUESTS.labels(method, code.name).inc()
        metrics.LATENCY.labels(method, "total").observe(total)
        if timings.decode:
            metrics.LATENCY.labels(method, "decode").observe(timings.decode)
        if timings.upstream:
            metrics.LATENCY.labels(method, "upstream").observe(timings.upstream)
        fields = {
            "method": method,
            "code": code.name,
            "request_id": request_id,
            "model": query.model.name if query else None,
            "requested_version": (query.model.version or query.model.label) if query else None,
            "version": outcome.model_version if outcome else None,
            "detections": len(outcome.detections) if outcome else None,
            "image_bytes": image_bytes,
            "latency_ms": {
                "decode": round(timings.decode * 1000, 2),
                "upstream": round(timings.upstream * 1000, 2),
                "total": round(total * 1000, 2),
            },
        }
        request_log.info("request", extra={"fields": fields})
