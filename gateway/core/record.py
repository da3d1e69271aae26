"""The request log line and the metrics of one image, whatever its outcome: what the pipeline
records once a request is answered or refused."""

from __future__ import annotations

from gateway import logs, metrics
from gateway.api.task import Task
from gateway.domain import ModelRef, Outcome, Request

request_log = logs.RequestLog()


def record(
    task: Task,
    request: Request,
    code: str,
    request_id: str,
    model: ModelRef | None,
    outcome: Outcome | None,
    timings: dict[str, float],
    total: float,
    notes: dict[str, object],
) -> None:
    method = request.method or task.name
    metrics.finish(method, code, total, timings["decode"], timings["upstream"])
    if not request_log.enabled():
        return
    fields: dict[str, object] = {
        "method": method,
        "code": code,
        "request_id": request_id,
        "task": task.name,
        "model": model.name if model else request.model.name or None,
        "requested_version": (model.version or model.label) if model else None,
        "version": outcome.model_version if outcome else None,
    }
    if outcome is not None:
        fields.update(task.summary(outcome.result))
    trace_id = trace_id_of(request.trace) if request.trace else ""
    if trace_id:
        fields["trace_id"] = trace_id
    fields["image_bytes"] = len(request.image)
    fields["latency_ms"] = {
        "decode": round(timings["decode"] * 1000, 2),
        "upstream": round(timings["upstream"] * 1000, 2),
        "total": round(total * 1000, 2),
    }
    fields.update(notes)
    request_log.write(fields)


def trace_id_of(trace: tuple[tuple[str, str], ...]) -> str:
    """The trace id from W3C traceparent (version-traceid-spanid-flags) or B3 headers."""
    for key, value in trace:
        if key == "traceparent":
            parts = value.split("-")
            if len(parts) >= 4 and len(parts[1]) == 32:
                return parts[1]
        elif key == "x-b3-traceid":
            return value
        elif key == "b3":
            return value.split("-", 1)[0]
    return ""
