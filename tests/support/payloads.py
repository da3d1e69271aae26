"""Records as the pipeline offers them to the payload log (gateway.paylog), and its counters."""

from __future__ import annotations

from prometheus_client import REGISTRY

from gateway.domain import ModelRef, Outcome, Request
from gateway.errors import GatewayError, Kind
from gateway.paylog.writer import PayloadLog, cost, held
from gateway.tasks.detection.nouns import Box, Detection, Detections, DetectOptions, NormalizedBox

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
DETECTIONS = Detections(
    [Detection(3, "car", 0.875, Box(4, 5, 20, 18), NormalizedBox(0.125, 0.25, 0.625, 0.5))]
)


def offer(
    log: PayloadLog,
    caller: str = "anonymous",
    image: bytes = b"\xff\xd8 not really a jpeg",
    request_id: str = "req-1",
    failure: GatewayError | None = None,
) -> None:
    model = ModelRef("detector", 2)
    request = Request(
        image, model, DetectOptions(0.5, 10), request_id, None, "Detect",
        (("traceparent", TRACEPARENT),), caller,
    )  # fmt: skip
    outcome = None
    if failure is None:
        outcome = Outcome(DETECTIONS, 32, 20, "detector", 2, request_id, {})
    log("detection", request, request_id, model, outcome, failure, 0.0125)


def record_cost(image: bytes, request_id: str, caller: str = "anonymous") -> int:
    """What one record `offer` makes reserves (images as their hash, an answer)."""
    texts = (request_id, caller, "Detect", "", TRACEPARENT)
    return cost(len(image), False, held(DETECTIONS), texts)


def refused() -> GatewayError:
    return GatewayError(Kind.INVALID_INPUT, "the image is empty; send the image's bytes")


def count(result: str) -> float:
    value = REGISTRY.get_sample_value(
        "vision_gateway_payload_log_records_total", {"result": result}
    )
    return value or 0.0
