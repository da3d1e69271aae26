"""Optional OpenTelemetry spans of the gateway's own: `decode` and `upstream`, off by default.

Without them the gateway already passes the caller's trace headers to TF Serving, so Istio's
spans connect through it. With the `otel` extra installed (`pip install '.[otel]'`) and
`OTEL_TRACES_EXPORTER` naming exporters (`otlp`, `console`; the standard variables configure
them: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
OTEL_PROPAGATORS, ...), each image gets two spans, children of the caller's context, and TF
Serving receives the `upstream` span's context. `OTEL_SDK_DISABLED=true` turns them off again.
The gateway imports nothing of OpenTelemetry unless it is on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

log = logging.getLogger("gateway.tracing")

Trace = tuple[tuple[str, str], ...]
_tracer: Any = None


def setup(environ: Mapping[str, str] = os.environ) -> bool:
    """Turns spans on when the environment asks for an exporter; True when on."""
    names = [name.strip() for name in environ.get("OTEL_TRACES_EXPORTER", "").lower().split(",")]
    names = [name for name in names if name and name != "none"]
    if not names or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed (the `otel` "
            "extra); the gateway adds no spans of its own"
        )
        return False
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
    default = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": "detection-gateway"}
    provider = TracerProvider(resource=Resource.create(default))
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            log.warning(f"unknown OTEL_TRACES_EXPORTER {name!r}: use otlp or console")
    use(provider)
    log.info("OpenTelemetry spans on", extra={"fields": {"exporters": names}})
    return True


def use(provider: Any) -> None:
    """Spans from this TracerProvider (None: off)."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer("gateway")


def enabled() -> bool:
    return _tracer is not None


def span(name: str, trace: Trace, **attributes: Any) -> AbstractContextManager[Trace]:
    """`_span` when spans are on; otherwise nothing, and the caller's headers go on as they are."""
    return _span(name, trace, **attributes) if _tracer is not None else nullcontext(trace)


@contextmanager
def _span(name: str, trace: Trace, **attributes: Any) -> Iterator[Trace]:
    """A span `name`, child of the caller's context in `trace` (its headers); yields the
    headers to send on: the caller's, with the trace context replaced by this span's."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    incoming = dict(trace)
    context = propagate.extract(incoming)
    kind = SpanKind.CLIENT if name == "upstream" else SpanKind.INTERNAL
    with _tracer.start_as_current_span(name, context=context, kind=kind) as current:
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(key, value)
        outgoing: dict[str, str] = {}
        propagate.inject(outgoing)
        kept = tuple((key, value) for key, value in trace if key not in outgoing)
        yield kept + tuple(outgoing.items())
