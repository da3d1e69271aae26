"""Prometheus metrics, served on their own HTTP port (GATEWAY_METRICS_PORT).

Per image the gateway counts the request by method and code, observes its stage latencies and
counts it in and out of flight. In one process these are plain numbers kept by `RequestMetrics`
and turned into metric families when Prometheus scrapes (a custom collector, prometheus_client's
documented way to export numbers an application keeps itself): updating them costs an image a
few dict and list operations, where six prometheus_client updates would each take a lock
(bench/results.md has what that costs). With --workers (PROMETHEUS_MULTIPROC_DIR set),
prometheus_client's own metrics are used, because only they write the files the supervisor adds
up. Both export the same names, labels, buckets and help text.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client import values as prometheus_values
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# Decode takes ~1-100 ms, TF Serving ~20 ms to seconds: buckets cover 1 ms .. 30 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

# The names keep their `detection_` prefix (dashboards rely on them) and count every task.
REQUESTS_NAME = "detection_gateway_requests"
REQUESTS_HELP = (
    "Images processed, by method (RPC or HTTP route) and canonical status code (one per "
    "stream frame)."
)
LATENCY_NAME = "detection_gateway_latency_seconds"
LATENCY_HELP = (
    "Time per image by stage: decode (image to tensor), upstream (TF Serving call), total."
)
IN_FLIGHT_NAME = "detection_gateway_in_flight_requests"
IN_FLIGHT_HELP = "Images being processed now."

UPSTREAM_RETRIES = Counter(
    "detection_gateway_upstream_retries",
    "Retry decisions on TF Serving calls that failed with UNAVAILABLE (not TF Serving's "
    "queue-full): retried, or not retried because the retry budget was spent.",
    ["rpc", "decision"],
)

# prometheus_client picks its value class at import: files when PROMETHEUS_MULTIPROC_DIR is
# set (gateway.workers sets it for each worker), plain numbers otherwise.
MULTIPROCESS = prometheus_values.ValueClass is not prometheus_values.MutexValue


class RequestMetrics:
    """Requests, stage latencies and images in flight of one process, as plain numbers.

    Updated on the event loop; read by the scrape in the metrics server's thread, which
    copies the tables before walking them (a scrape may see an image's count a moment
    before its latency sum, as with any metrics library).
    """

    def __init__(self, buckets: tuple[float, ...] = _BUCKETS) -> None:
        self.buckets = buckets
        self.in_flight = 0
        # (method, code) -> [count, created]
        self._requests: dict[tuple[str, str], list[float]] = {}
        # (method, stage) -> [count per bucket (the last: +Inf), sum, created]
        self._latency: dict[tuple[str, str], list[float]] = {}

    def record(self, method: str, code: str, total: float, decode: float, upstream: float) -> None:
        """Counts one image and observes its stage latencies (a stage that did not run, 0,
        is not observed)."""
        counter = self._requests.get((method, code))
        if counter is None:
            counter = self._requests[(method, code)] = [0.0, time.time()]
        counter[0] += 1
        self._observe(method, "total", total)
        if decode:
            self._observe(method, "decode", decode)
        if upstream:
            self._observe(method, "upstream", upstream)

    def _observe(self, method: str, stage: str, seconds: float) -> None:
        histogram = self._latency.get((method, stage))
        if histogram is None:
            histogram = [0.0] * (len(self.buckets) + 1) + [0.0, time.time()]
            self._latency[(method, stage)] = histogram
        # bisect_left: the first bound >= seconds, as Prometheus' `le` buckets count.
        histogram[bisect_left(self.buckets, seconds)] += 1
        histogram[-2] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(REQUESTS_NAME, REQUESTS_HELP, labels=["method", "code"])
        for (method, code), (count, created) in list(self._requests.items()):
            requests.add_metric([method, code], count, created=created)
        yield requests
        latency = HistogramMetricFamily(LATENCY_NAME, LATENCY_HELP, labels=["method", "stage"])
        bounds = [*map(floatToGoString, self.buckets), "+Inf"]
        for (method, stage), histogram in list(self._latency.items()):
            histogram = list(histogram)
            cumulative, buckets = 0.0, []
            for bound, count in zip(bounds, histogram[:-2], strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric([method, stage], buckets, histogram[-2])
            labels = {"method": method, "stage": stage}
            latency.samples.append(Sample(LATENCY_NAME + "_created", labels, histogram[-1]))
        yield latency
        yield GaugeMetricFamily(IN_FLIGHT_NAME, IN_FLIGHT_HELP, value=self.in_flight)


if MULTIPROCESS:
    REQUESTS = Counter(REQUESTS_NAME, REQUESTS_HELP, ["method", "code"])
    LATENCY = Histogram(LATENCY_NAME, LATENCY_HELP, ["method", "stage"], buckets=_BUCKETS)
    # livesum: the supervisor reports the sum over the running workers.
    IN_FLIGHT = Gauge(IN_FLIGHT_NAME, IN_FLIGHT_HELP, multiprocess_mode="livesum")
    _children: dict[tuple[str, str], tuple[Counter, Histogram, Histogram, Histogram]] = {}

    def start() -> None:
        """An image entered the pipeline."""
        IN_FLIGHT.inc()

    def record(method: str, code: str, total: float, decode: float, upstream: float) -> None:
        """Counts one image and observes its stage latencies (labelled metrics looked up
        once)."""
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

    def finish(method: str, code: str, total: float, decode: float, upstream: float) -> None:
        """An image left the pipeline: out of flight, counted and observed."""
        IN_FLIGHT.dec()
        record(method, code, total, decode, upstream)

else:
    REQUEST_METRICS = RequestMetrics()
    REGISTRY.register(REQUEST_METRICS)
    record = REQUEST_METRICS.record

    def start() -> None:
        """An image entered the pipeline."""
        REQUEST_METRICS.in_flight += 1

    def finish(method: str, code: str, total: float, decode: float, upstream: float) -> None:
        """An image left the pipeline: out of flight, counted and observed."""
        REQUEST_METRICS.in_flight -= 1
        REQUEST_METRICS.record(method, code, total, decode, upstream)


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
