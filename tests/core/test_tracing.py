"""The optional OpenTelemetry spans: off by default, and when on, `decode` and `upstream`
spans continue the caller's trace and TF Serving receives the `upstream` span's context."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway import tracing
from gateway.domain import ModelRef, Request
from gateway.tasks.detection.nouns import DetectOptions
from tests.support.pipelines import classifier_models, pipeline_for, png, solid

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)


def test_spans_are_off_unless_an_exporter_is_named():
    assert not tracing.setup({})
    assert not tracing.setup({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.setup({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.enabled()
    try:
        assert tracing.setup({"OTEL_TRACES_EXPORTER": "console"})
        assert tracing.enabled()
    finally:
        tracing.use(None)


def test_decode_and_upstream_spans_continue_the_callers_trace(exporter):
    model = classifier_models()[3]  # the fixed-size detector
    trace = (
        ("traceparent", f"00-{TRACE_ID}-{CALLER_SPAN}-01"),
        ("x-request-id", "r-7"),
    )

    async def scenario() -> dict[str, str]:
        async with pipeline_for([model], model="fixed") as (pipeline, serving):
            request = Request(
                png(solid(64, 48, (9, 9, 9))), ModelRef(""), DetectOptions(), "r-7", trace=trace
            )
            await pipeline.run("detection", request)
            return serving.calls[-1].metadata

    received = asyncio.run(scenario())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"decode", "upstream"}
    for s in spans.values():
        assert f"{s.context.trace_id:032x}" == TRACE_ID
        assert f"{s.parent.span_id:016x}" == CALLER_SPAN
        assert s.attributes["model"] == "fixed"
    upstream = spans["upstream"]
    # TF Serving sees the trace continue from the gateway's upstream span.
    assert received["traceparent"] == f"00-{TRACE_ID}-{upstream.context.span_id:016x}-01"
    assert received["x-request-id"] == "r-7"
