"""Gateway lifecycle against a real local TF Serving: readiness and graceful shutdown."""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.gateway.gatewayproc import NOT_SERVING, SERVICE, SERVING, run_gateway
from tests.localserver import run_local_server


@pytest.fixture(scope="module")
def tfs(model_repo: Path) -> Iterator[object]:
    args = ["--model_name=detector", f"--model_base_path={model_repo / 'detector'}"]
    with run_local_server(args) as server:
        yield server


def test_health_follows_tf_serving_and_recovers_by_itself(tfs, tmp_path):
    with run_gateway(tfs.target, log_dir=tmp_path) as gw:
        assert gw.health("") == SERVING
        assert gw.health(SERVICE) == SERVING
        assert gw.health("liveness") == SERVING

        tfs.stop()
        gw.wait_health(NOT_SERVING, SERVICE, timeout=30)
        assert gw.health("") == NOT_SERVING
        assert gw.health("liveness") == SERVING  # no restart of the gateway for this

        tfs.restart()
        gw.wait_health(SERVING, SERVICE, timeout=180)
        assert gw.health("") == SERVING
        scene = scenes.generate_scene(np.random.default_rng(1), 200, 150, 3)
        with gw.channel() as channel:
            result = gw.stub(channel).Detect(
                pb.DetectRequest(image=scenes.encode(scene.pixels, "PNG")), timeout=60
            )
        assert len(result.detections) == len(scene.boxes)


def _in_flight(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    match = re.search(rb"^detection_gateway_in_flight_requests (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_sigterm_during_load_loses_no_in_flight_request(tfs, tmp_path):
    scene = scenes.generate_scene(np.random.default_rng(2), 1800, 1400, 12, noise_sigma=10)
    image = scenes.encode(scene.pixels, "PNG")
    with run_gateway(tfs.target, ["--shutdown-grace=60"], log_dir=tmp_path) as gw:
        results: list[object] = []

        def call() -> None:
            with gw.channel() as channel:
                try:
                    reply = gw.stub(channel).Detect(pb.DetectRequest(image=image), timeout=120)
                    results.append(len(reply.detections))
                except grpc.RpcError as e:
                    results.append(e.code())

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while _in_flight(gw.metrics_port) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _in_flight(gw.metrics_port) == 6

        gw.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert gw.process.wait(60) == 0
        assert results == [len(scene.boxes)] * 6

        with gw.channel() as channel, pytest.raises(grpc.RpcError) as info:
            gw.stub(channel).Detect(pb.DetectRequest(image=image), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
