"""Prometheus metrics, served on their own HTTP port (GATEWAY_METRICS_PORT)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

# Decode takes ~1-100 ms, TF Serving ~20 ms to seconds: buckets cover 1 ms .. 30 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

# The names keep their `detection_` prefix (dashboards rely on them) and count every task.
REQUESTS = Counter(
    "detection_gateway_requests",
    "Images processed, by method (RPC or HTTP route) and canonical status code (one per "
    "stream frame).",
    ["method", "code"],
)
LATENCY = Histogram(
    "detection_gateway_latency_seconds",
    "Time per image by stage: decode (image to tensor), upstream (TF Serving call), total.",
    ["method", "stage"],
    buckets=_BUCKETS,
)
# livesum: with --workers, the supervisor reports the sum over the running workers.
IN_FLIGHT = Gauge(
    "detection_gateway_in_flight_requests",
    "Images being processed now.",
    multiprocess_mode="livesum",
)

UPSTREAM_RETRIES = Counter(
    "detection_gateway_upstream_retries",
    "Retry decisions on TF Serving calls that failed with UNAVAILABLE (not TF Serving's "
    "queue-full): retried, or not retried because the retry budget was spent.",
    ["rpc", "decision"],
)


_children: dict[tuple[str, str], tuple[Counter, Histogram, Histogram, Histogram]] = {}


def record(method: str, code: str, total: float, decode: float, upstream: float) -> None:
    """Counts one image and observes its stage latencies (labelled metrics looked up once)."""
    children = _children.get((method, code))
    if children is None:
        children = (
            REQUESTS.labels(method, code),
            LATENCY.labels(method, "total"),
            LATENCY.labels(method, "decode"),
            LATENCY.labels(method, "upstream"),
        )
        _children[(method, code)] = children
    requests, total_hist, decode_hist, upstream_hist = children
    requests.inc()
    total_hist.observe(total)
    if decode:
        decode_hist.observe(decode)
    if upstream:
        upstream_hist.observe(upstream)


def serve(port: int, host: str) -> None:
    """Starts the metrics HTTP server in a daemon thread (no-op for port 0)."""
    if port:
        start_http_server(port, addr=host)


def serve_multiprocess(port: int, host: str, directory: str) -> None:
    """Serves the sum of the metrics workers write into `directory` (no-op for port 0).

    Workers write there when PROMETHEUS_MULTIPROC_DIR names the directory (gateway.workers).
    """
    if port:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
        start_http_server(port, addr=host, registry=registry)
