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
from collections.abc import Iterable, Iterator

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

# Every metric of the gateway is named vision_gateway_*; until the next release each is
# served under its first name too, detection_gateway_* (CHANGELOG.md), for the dashboards
# and autoscalers that read those.
PREFIX = "vision_gateway_"
LEGACY_PREFIX = "detection_gateway_"
REQUESTS_NAME = "vision_gateway_requests"
REQUESTS_HELP = (
    "Images processed, by method (RPC or HTTP route) and canonical status code (one per "
    "stream frame)."
)
LATENCY_NAME = "vision_gateway_latency_seconds"
LATENCY_HELP = (
    "Time per image by stage: decode (image to tensor), upstream (TF Serving call), total."
)
IN_FLIGHT_NAME = "vision_gateway_in_flight_requests"
IN_FLIGHT_HELP = "Images being processed now."
# Per model: what an autoscaler of TF Serving reads (k8s/components/queue-autoscaling). The
# label is a model the model config names; any other name a caller sends counts as `other`,
# so callers cannot grow the number of series.
MODEL_IN_FLIGHT_NAME = "vision_gateway_model_in_flight_requests"
MODEL_IN_FLIGHT_HELP = (
    "Images for this model in the gateway now: being decoded, waiting for TF Serving or "
    "being answered (models the model config does not name count as `other`)."
)
MODEL_QUEUE_NAME = "vision_gateway_model_queue_depth"
MODEL_QUEUE_HELP = (
    "Images of this model waiting for TF Serving's answer: queued in the gateway for a call "
    "or sent and not answered yet, i.e. TF Serving's queue plus what it is running, as this "
    "gateway sees it."
)
OTHER_MODEL = "other"
IN_FLIGHT_AT, QUEUED_AT = 0, 1  # positions in a model's counts

UPSTREAM_RETRIES = Counter(
    "vision_gateway_upstream_retries",
    "Retry decisions on TF Serving calls that failed with UNAVAILABLE (not TF Serving's "
    "queue-full): retried, or not retried because the retry budget was spent.",
    ["rpc", "decision"],
)

# Batching (gateway.core.coalescer), per model: one observation per Predict call and per image
# of a model that batches, so prometheus_client's own metrics (a lock each) cost little.
# Images per upstream call = rate(..._batch_size_sum) / rate(..._batch_size_count).
BATCH_SIZE = Histogram(
    "vision_gateway_upstream_batch_size",
    "Images per Predict call to TF Serving, by model (1: the image went alone).",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
QUEUE_WAIT = Histogram(
    "vision_gateway_batch_queue_wait_seconds",
    "Time an image of a model that batches waited for its Predict call to be sent, by model "
    "(0: sent at once).",
    ["model"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_SPLITS = Counter(
    "vision_gateway_batch_splits",
    "Batches sent again in parts, by model and reason: too_large (TF Serving refused the "
    "batch's size: sent again in halves), refused (perhaps one image it cannot take: halves, "
    "down to that image) or unsplittable (an output without the batch dimension: one image "
    "per call).",
    ["model", "reason"],
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
        # model label -> [images in flight, images waiting for TF Serving]
        self.models: dict[str, list[int]] = {}
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
        if not self.models:
            return
        in_flight = GaugeMetricFamily(MODEL_IN_FLIGHT_NAME, MODEL_IN_FLIGHT_HELP, labels=["model"])
        queued = GaugeMetricFamily(MODEL_QUEUE_NAME, MODEL_QUEUE_HELP, labels=["model"])
        for model, counts in list(self.models.items()):
            in_flight.add_metric([model], counts[IN_FLIGHT_AT])
            queued.add_metric([model], counts[QUEUED_AT])
        yield in_flight
        yield queued

    def add(self, model: str, which: int, delta: int) -> None:
        """Moves a model's count of images in flight (IN_FLIGHT_AT) or waiting for TF
        Serving (QUEUED_AT) by `delta`."""
        counts = self.models.get(model)
        if counts is None:
            counts = self.models[model] = [0, 0]
        counts[which] += delta


if MULTIPROCESS:
    REQUESTS = Counter(REQUESTS_NAME, REQUESTS_HELP, ["method", "code"])
    LATENCY = Histogram(LATENCY_NAME, LATENCY_HELP, ["method", "stage"], buckets=_BUCKETS)
    # livesum: the supervisor reports the sum over the running workers.
    IN_FLIGHT = Gauge(IN_FLIGHT_NAME, IN_FLIGHT_HELP, multiprocess_mode="livesum")
    _MODEL_GAUGES = (
        Gauge(MODEL_IN_FLIGHT_NAME, MODEL_IN_FLIGHT_HELP, ["model"], multiprocess_mode="livesum"),
        Gauge(MODEL_QUEUE_NAME, MODEL_QUEUE_HELP, ["model"], multiprocess_mode="livesum"),
    )

    def _add_model(model: str, which: int, delta: int) -> None:
        _MODEL_GAUGES[which].labels(model).inc(delta)

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
    _add_model = REQUEST_METRICS.add

    def start() -> None:
        """An image entered the pipeline."""
        REQUEST_METRICS.in_flight += 1

    def finish(method: str, code: str, total: float, decode: float, upstream: float) -> None:
        """An image left the pipeline: out of flight, counted and observed."""
        REQUEST_METRICS.in_flight -= 1
        REQUEST_METRICS.record(method, code, total, decode, upstream)


class _Held:
    """Counts an image in one of a model's gauges while the `with` block runs."""

    __slots__ = ("_model", "_which")

    def __init__(self, model: str, which: int) -> None:
        self._model, self._which = model, which

    def __enter__(self) -> None:
        _add_model(self._model, self._which, 1)

    def __exit__(self, *exc: object) -> None:
        _add_model(self._model, self._which, -1)


class ModelLoad:
    """Per-model gauges of one pipeline: images in flight and waiting for TF Serving.

    `models` are the names the model config lists: they get their own label (exported as 0
    from the start, so an autoscaler's query has a series before the first request); any
    other name counts as `other`."""

    def __init__(self, models: Iterable[str]) -> None:
        self._known = frozenset(m for m in models if m)
        for model in self._known:
            _add_model(model, IN_FLIGHT_AT, 0)
            _add_model(model, QUEUED_AT, 0)

    def label(self, model: str) -> str:
        return model if model in self._known else OTHER_MODEL

    def in_flight(self, model: str) -> _Held:
        return _Held(self.label(model), IN_FLIGHT_AT)

    def queued(self, model: str) -> _Held:
        return _Held(self.label(model), QUEUED_AT)


class _WithLegacyNames:
    """A registry's metrics, and each of the gateway's again under its first name."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            yield family
            if family.name.startswith(PREFIX):
                legacy = Metric(
                    LEGACY_PREFIX + family.name.removeprefix(PREFIX),
                    family.documentation,
                    family.type,
                    family.unit,
                )
                legacy.samples = [
                    sample._replace(name=LEGACY_PREFIX + sample.name.removeprefix(PREFIX))
                    for sample in family.samples
                ]
                yield legacy


def exposed(source: CollectorRegistry = REGISTRY) -> CollectorRegistry:
    """What the metrics port serves: `source`'s metrics with the legacy names beside."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WithLegacyNames(source))
    return registry


def serve(port: int, host: str) -> None:
    """Starts the metrics HTTP server in a daemon thread (no-op for port 0)."""
    if port:
        start_http_server(port, addr=host, registry=exposed())


def serve_multiprocess(port: int, host: str, directory: str) -> None:
    """Serves the sum of the metrics workers write into `directory` (no-op for port 0).

    Workers write there when PROMETHEUS_MULTIPROC_DIR names the directory (gateway.workers).
    """
    if port:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
        start_http_server(port, addr=host, registry=exposed(registry))
