"""The per-image metrics kept as plain numbers export what prometheus_client's own metrics
(used with --workers) export for the same images: names, labels, buckets, values, help."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway import metrics

# (method, code, total, decode, upstream): every bucket edge, a value on an edge, stages
# that did not run (0), and two methods and codes.
IMAGES = [
    ("Detect", "OK", 0.0004, 0.0001, 0.0003),
    ("Detect", "OK", 0.001, 0.0, 0.0009),
    ("Detect", "OK", 0.0123, 0.002, 0.01),
    ("Detect", "INVALID_ARGUMENT", 0.0002, 0.0, 0.0),
    ("POST :classify", "OK", 31.0, 0.5, 30.0),
    ("POST :classify", "OK", 2.5, 0.25, 2.2),
]


def _exposition(registry: CollectorRegistry) -> list[str]:
    """The scrape's lines, without the `_created` timestamps' values (they differ)."""
    text = generate_latest(registry).decode()
    return sorted(re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", line) for line in text.splitlines())


def test_plain_numbers_export_what_prometheus_client_exports() -> None:
    reference = CollectorRegistry()
    requests = Counter(
        metrics.REQUESTS_NAME, metrics.REQUESTS_HELP, ["method", "code"], registry=reference
    )
    latency = Histogram(
        metrics.LATENCY_NAME,
        metrics.LATENCY_HELP,
        ["method", "stage"],
        buckets=metrics._BUCKETS,
        registry=reference,
    )
    in_flight = Gauge(metrics.IN_FLIGHT_NAME, metrics.IN_FLIGHT_HELP, registry=reference)
    plain = metrics.RequestMetrics()
    ours = CollectorRegistry()
    ours.register(plain)
    for _ in range(3):
        in_flight.inc()
        plain.in_flight += 1
    in_flight.dec()
    plain.in_flight -= 1
    for method, code, total, decode, upstream in IMAGES:
        requests.labels(method, code).inc()
        latency.labels(method, "total").observe(total)
        if decode:
            latency.labels(method, "decode").observe(decode)
        if upstream:
            latency.labels(method, "upstream").observe(upstream)
        plain.record(method, code, total, decode, upstream)
    for bound in metrics._BUCKETS:  # exactly on each bucket's upper bound: counted in it
        latency.labels("Detect", "total").observe(bound)
        plain.record("Detect", "OK", bound, 0.0, 0.0)
        requests.labels("Detect", "OK").inc()
    assert _exposition(ours) == _exposition(reference)
    assert "vision_gateway_in_flight_requests 2.0" in _exposition(ours)


def test_the_gateway_process_exports_the_plain_numbers() -> None:
    """Without PROMETHEUS_MULTIPROC_DIR (how tests and a one-process gateway run), the
    per-image metrics are the plain numbers, counted in and out of flight."""
    assert not metrics.MULTIPROCESS
    before = metrics.REQUEST_METRICS.in_flight
    metrics.start()
    assert metrics.REQUEST_METRICS.in_flight == before + 1
    metrics.finish("TestMethod", "OK", 0.01, 0.001, 0.005)
    assert metrics.REQUEST_METRICS.in_flight == before
    text = generate_latest().decode()
    assert 'vision_gateway_requests_total{code="OK",method="TestMethod"} 1.0' in text
    assert (
        'vision_gateway_latency_seconds_bucket{le="0.01",method="TestMethod",stage="total"}'
        " 1.0" in text
    )


def test_every_metric_is_served_under_its_first_name_too() -> None:
    """Dashboards and autoscalers reading detection_gateway_* keep working for one release."""
    registry = CollectorRegistry()
    requests = Counter("vision_gateway_widgets", "Widgets.", ["kind"], registry=registry)
    requests.labels("round").inc(3)
    Gauge("other_metric", "Not ours.", registry=registry).set(1)
    text = generate_latest(metrics.exposed(registry)).decode()
    assert 'vision_gateway_widgets_total{kind="round"} 3.0' in text
    assert 'detection_gateway_widgets_total{kind="round"} 3.0' in text
    assert "# HELP detection_gateway_widgets_total Widgets." in text
    assert "other_metric 1.0" in text and "detection_other" not in text


def test_the_gateways_metrics_are_named_for_what_it_is() -> None:
    names = {family.name for family in metrics.REGISTRY.collect()}
    ours = {name for name in names if "gateway" in name}
    assert ours and all(name.startswith(metrics.PREFIX) for name in ours), sorted(ours)
