"""Per-model load on the metrics port: images in flight and waiting for TF Serving by model,
the signal k8s/components/queue-autoscaling scales TF Serving on. A real gateway process in
front of a real local TF Serving whose Predicts a fault proxy holds, so the waiting images are
seen while they wait; one process, and --workers 2 (the supervisor's sum)."""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from gateway import metrics
from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

# Slow (make test-fast leaves it out): three gateway processes and TF Serving, about 50 s.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving with every reference model (tests/conftest.py)."""
    return reference_serving


@pytest.fixture
def faulty(tfs: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(tfs.target) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def image() -> bytes:
    scene = scenes.generate_scene(np.random.default_rng(7), 160, 120, 2)
    return scenes.encode(scene.pixels, "PNG")


def gauges(gw: GatewayProcess) -> dict[tuple[str, str], float]:
    """(metric, model) -> value of the per-model gauges on the gateway's metrics port."""
    url = f"http://127.0.0.1:{gw.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    names = f"{metrics.MODEL_IN_FLIGHT_NAME}|{metrics.MODEL_QUEUE_NAME}"
    found = re.findall(rf'^({names})\{{model="([^"]*)"\}} (\S+)$', text, re.MULTILINE)
    return {(name, model): float(value) for name, model, value in found}


def detect(gw: GatewayProcess, image: bytes, model: str = "") -> grpc.StatusCode:
    request = pb.DetectRequest(image=image)
    if model:
        request.model.name = model
    with gw.channel() as channel:
        try:
            gw.stub(channel).Detect(request, timeout=120)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def held_detects(gw: GatewayProcess, image: bytes, faulty: FaultyUpstream, count: int) -> list:
    """`count` Detect calls started while TF Serving holds every Predict; returns once TF
    Serving has all of them, with the threads and where their codes go."""
    codes: list[grpc.StatusCode] = []
    faulty.hold()
    threads = [
        threading.Thread(target=lambda: codes.append(detect(gw, image)), daemon=True)
        for _ in range(count)
    ]
    for t in threads:
        t.start()
    faulty.wait_active(count)
    return [threads, codes]


@pytest.mark.parametrize("workers", [1, 2])
def test_images_waiting_for_tf_serving_are_counted_per_model(
    faulty: FaultyUpstream, image: bytes, tmp_path: Path, workers: int
) -> None:
    with run_gateway(faulty.target, [f"--workers={workers}"], log_dir=tmp_path) as gw:
        # Before any request: the configured model has its series, at 0 (an autoscaler's
        # query finds it from the start).
        idle = gauges(gw)
        assert idle[(metrics.MODEL_QUEUE_NAME, "detector")] == 0
        assert idle[(metrics.MODEL_IN_FLIGHT_NAME, "detector")] == 0
        threads, codes = held_detects(gw, image, faulty, 3)
        busy = gauges(gw)
        faulty.release()
        for t in threads:
            t.join(120)
        assert codes == [grpc.StatusCode.OK] * 3
        after = gauges(gw)
    assert busy[(metrics.MODEL_QUEUE_NAME, "detector")] == 3
    assert busy[(metrics.MODEL_IN_FLIGHT_NAME, "detector")] == 3
    # Answered: out of both gauges (before the answer left).
    assert after[(metrics.MODEL_QUEUE_NAME, "detector")] == 0
    assert after[(metrics.MODEL_IN_FLIGHT_NAME, "detector")] == 0


def test_model_names_the_config_does_not_name_count_as_other(
    faulty: FaultyUpstream, image: bytes, tmp_path: Path
) -> None:
    with run_gateway(faulty.target, log_dir=tmp_path) as gw:
        codes = [detect(gw, image, f"no-such-model-{i}") for i in range(5)]
        seen = gauges(gw)
    assert set(codes) == {grpc.StatusCode.NOT_FOUND}
    assert {model for _, model in seen} == {"detector", metrics.OTHER_MODEL}
    assert seen[(metrics.MODEL_IN_FLIGHT_NAME, metrics.OTHER_MODEL)] == 0


def test_plain_numbers_export_what_prometheus_client_exports_per_model() -> None:
    """One process keeps the per-model counts as plain numbers; --workers uses
    prometheus_client's labelled gauges: both export the same lines."""
    reference = CollectorRegistry()
    in_flight = Gauge(metrics.MODEL_IN_FLIGHT_NAME, metrics.MODEL_IN_FLIGHT_HELP, ["model"],
                      registry=reference)  # fmt: skip
    queued = Gauge(metrics.MODEL_QUEUE_NAME, metrics.MODEL_QUEUE_HELP, ["model"],
                   registry=reference)  # fmt: skip
    plain = metrics.RequestMetrics()
    for model, flying, waiting in (("detector", 3, 2), ("classifier", 0, 0), ("other", 1, 0)):
        in_flight.labels(model).inc(flying)
        queued.labels(model).inc(waiting)
        plain.add(model, metrics.IN_FLIGHT_AT, flying)
        plain.add(model, metrics.QUEUED_AT, waiting)
    ours = CollectorRegistry()
    ours.register(plain)
    lines = generate_latest(ours).decode().splitlines()
    wanted = generate_latest(reference).decode().splitlines()
    assert [line for line in lines if "_model_" in line] == wanted
    assert f'{metrics.MODEL_QUEUE_NAME}{{model="detector"}} 2.0' in wanted
