"""Gateway lifecycle against a real local TF Serving: readiness and graceful shutdown.

The shutdown tests hold their calls in tests/support/faultupstream.py (in front of the real TF
Serving) while SIGTERM arrives, and release them once the gateway has begun to drain: the
calls are in flight during the drain however fast or loaded the machine is."""

from __future__ import annotations

import os
import shutil
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
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import (
    NOT_SERVING,
    SERVICE,
    SERVING,
    GatewayProcess,
    run_gateway,
)
from tests.support.localserver import run_local_server


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


def detect_in_background(
    gw: GatewayProcess, image: bytes, count: int
) -> tuple[list[threading.Thread], list[object]]:
    """Starts `count` Detect calls, each on its own connection, and returns once the gateway
    counts all of them in flight. `results` gets each reply's detection count or error code."""
    results: list[object] = []

    def call() -> None:
        with gw.channel() as channel:
            try:
                reply = gw.stub(channel).Detect(pb.DetectRequest(image=image), timeout=120)
                results.append(len(reply.detections))
            except grpc.RpcError as e:
                results.append(e.code())

    threads = [threading.Thread(target=call) for _ in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while gw.in_flight() < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gw.in_flight() == count
    return threads, results


def draining(gw: GatewayProcess) -> int:
    """How many gateway processes have logged that they are shutting down."""
    return sum(r.get("message") == "shutting down" for r in gw.records())


def test_sigterm_during_load_loses_no_in_flight_request(tfs, tmp_path):
    scene = scenes.generate_scene(np.random.default_rng(2), 320, 240, 4)
    image = scenes.encode(scene.pixels, "PNG")
    with (
        FaultyUpstream(tfs.target) as upstream,
        run_gateway(upstream.target, ["--shutdown-grace=300"], log_dir=tmp_path) as gw,
    ):
        upstream.hold()
        threads, results = detect_in_background(gw, image, 6)
        upstream.wait_active(6)

        gw.process.send_signal(signal.SIGTERM)
        wait_for(lambda: draining(gw) == 1, "the gateway to start draining")
        upstream.release()
        for t in threads:
            t.join(120)
        assert gw.process.wait(120) == 0
        assert results == [len(scene.boxes)] * 6

        with gw.channel() as channel, pytest.raises(grpc.RpcError) as info:
            gw.stub(channel).Detect(pb.DetectRequest(image=image), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_over_the_concurrency_limit_is_resource_exhausted(tfs, tmp_path):
    scene = scenes.generate_scene(np.random.default_rng(3), 320, 240, 4)
    image = scenes.encode(scene.pixels, "JPEG")
    with (
        FaultyUpstream(tfs.target) as upstream,
        run_gateway(upstream.target, ["--max-concurrent-requests=1"], log_dir=tmp_path) as gw,
    ):
        upstream.hold()
        threads, results = detect_in_background(gw, image, 1)
        upstream.wait_active(1)  # the first image is in flight until released
        with gw.channel() as channel, pytest.raises(grpc.RpcError) as refused:
            gw.stub(channel).Detect(pb.DetectRequest(image=image), timeout=60)
        upstream.release()
        for t in threads:
            t.join(120)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "GATEWAY_MAX_CONCURRENT_REQUESTS" in (refused.value.details() or "")
    assert results == [len(scene.boxes)]


def test_round_robin_spreads_requests_over_every_tf_serving_address(
    tfs, model_repo: Path, tmp_path_factory
):
    # A second server that only has version 2 tells the two upstreams apart in the results.
    from serving.export import export_models

    repo = tmp_path_factory.mktemp("v2-only")
    export_models(repo, version=2, names=["detector"])
    args = ["--model_name=detector", f"--model_base_path={repo / 'detector'}"]
    with run_local_server(args) as second:
        target = f"ipv4:127.0.0.1:{tfs.port},127.0.0.1:{second.port}"
        log_dir = tmp_path_factory.mktemp("rr")
        # Health checks share the channel; keep them out of the way of the rotation.
        lb_args = ["--upstream-lb=round_robin", "--health-interval=60"]
        with run_gateway(target, lb_args, log_dir=log_dir) as gw:
            scene = scenes.generate_scene(np.random.default_rng(4), 160, 120, 2)
            request = pb.DetectRequest(image=scenes.encode(scene.pixels, "PNG"))
            with gw.channel() as channel:
                stub = gw.stub(channel)
                # round_robin uses each address once its connection is up, and a newly seen
                # version is described first: call until both have answered.
                seen: list[int] = []
                deadline = time.monotonic() + 120
                while set(seen) != {1, 2}:
                    assert time.monotonic() < deadline, f"only these answered: {seen}"
                    seen.append(stub.Detect(request, timeout=60).model.version)
                versions = [stub.Detect(request, timeout=60).model.version for _ in range(10)]
    # Both connected and described, the calls alternate; a health check of the shared
    # channel may take one turn of the rotation.
    assert versions.count(1) >= 4 and versions.count(2) >= 4, (seen, versions)


def test_new_version_with_another_input_type_is_picked_up_without_restart(
    model_repo: Path, tmp_path_factory
):
    """Version 2 takes encoded bytes where version 1 took pixels: the gateway notices from
    TF Serving's answer, reads the new signature and serves on, with no failed request."""
    from serving.export import export_model

    repo = tmp_path_factory.mktemp("rollout")
    shutil.copytree(model_repo / "detector", repo / "detector")
    staging = tmp_path_factory.mktemp("staging")
    encoded_v2 = export_model(staging, "detector_encoded", version=2)
    args = [
        "--model_name=detector",
        f"--model_base_path={repo / 'detector'}",
        "--file_system_poll_wait_seconds=1",
    ]
    scene = scenes.generate_scene(np.random.default_rng(5), 320, 240, 4)
    request = pb.DetectRequest(image=scenes.encode(scene.pixels, "JPEG"))
    with run_local_server(args) as server:
        log_dir = tmp_path_factory.mktemp("rollout-logs")
        with run_gateway(server.target, log_dir=log_dir) as gw, gw.channel() as channel:
            stub = gw.stub(channel)
            assert stub.Detect(request, timeout=60).model.version == 1
            encoded_v2.rename(repo / "detector" / "2")  # what a model push does
            deadline = time.monotonic() + 120
            versions = []
            while time.monotonic() < deadline and versions[-1:] != [2]:
                result = stub.Detect(request, timeout=60)
                assert len(result.detections) == len(scene.boxes)
                versions.append(result.model.version)
                time.sleep(0.2)
    assert versions[-1] == 2


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_workers_share_the_port_sum_their_metrics_and_drain_on_sigterm(tfs, tmp_path):
    scene = scenes.generate_scene(np.random.default_rng(6), 320, 240, 4)
    image = scenes.encode(scene.pixels, "PNG")
    args = ["--workers=2", "--shutdown-grace=300"]
    with (
        FaultyUpstream(tfs.target) as upstream,
        run_gateway(upstream.target, args, log_dir=tmp_path) as gw,
    ):
        workers = _children(gw.process.pid)
        assert len(workers) == 2
        # Each call on its own connection: the kernel hands connections to either worker
        # (by a hash of the connection), so calls go on until both have served some.
        small = scenes.generate_scene(np.random.default_rng(7), 240, 180, 3)
        calls = 0
        served: set[int] = set()
        while len(served) < 2 and calls < 200:
            with gw.channel() as channel:
                request = pb.DetectRequest(image=scenes.encode(small.pixels, "PNG"))
                result = gw.stub(channel).Detect(request, timeout=60)
            calls += 1
            assert len(result.detections) == len(small.boxes)
            served = {r["pid"] for r in gw.records() if r.get("method") == "Detect"}
        assert served == set(workers), (served, workers, calls)
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{gw.metrics_port}/metrics", timeout=5
        ).read()
        # The supervisor's figure is the sum over both workers: every call, once.
        total = f'vision_gateway_requests_total{{code="OK",method="Detect"}} {calls}.0'
        assert total.encode() in metrics

        # Summed over both workers.
        upstream.hold()
        threads, results = detect_in_background(gw, image, 4)
        upstream.wait_active(4)

        gw.process.send_signal(signal.SIGTERM)  # the supervisor forwards it to both workers
        wait_for(lambda: draining(gw) == 2, "both workers to start draining")
        upstream.release()
        for t in threads:
            t.join(120)
        assert gw.process.wait(120) == 0
        assert results == [len(scene.boxes)] * 4
        # The supervisor waited for (and reaped) both workers before exiting.
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


def test_a_worker_that_dies_stops_the_gateway_with_an_error(tfs, tmp_path):
    with run_gateway(tfs.target, ["--workers=2"], log_dir=tmp_path) as gw:
        workers = _children(gw.process.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        assert gw.process.wait(60) == 1
        assert "a worker exited" in gw.log_path.read_text()


def wait_for(condition, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Polls `condition()` until true; the timeout only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout} s")
        time.sleep(0.05)


def probe_many(gw: GatewayProcess, count: int = 24) -> set[int]:
    """Health of the API service from `count` new connections: the kernel hands each to
    either worker (SO_REUSEPORT), so both answer with near certainty (1 - 2**-23)."""
    return {gw.health(SERVICE) for _ in range(count)}


def test_with_workers_every_worker_answers_for_the_whole_pod(tfs, tmp_path):
    """One worker loses TF Serving (the fault upstream cuts off its connection only): both
    workers answer NOT_SERVING, and both SERVING again once it is back."""
    with (
        FaultyUpstream(tfs.target) as upstream,
        run_gateway(upstream.target, ["--workers=2"], log_dir=tmp_path) as gw,
    ):
        wait_for(lambda: gw.serving_workers() == {0, 1}, "both workers to be SERVING")
        assert probe_many(gw) == {SERVING}
        # No worker said SERVING before both listened.
        records = gw.records()
        listening = [i for i, r in enumerate(records) if r.get("message") == "gateway listening"]
        serving = [i for i, r in enumerate(records) if r.get("serving") is True]
        assert len(listening) == 2 and len(serving) == 2
        assert max(listening) < min(serving)

        def status_callers() -> set[str]:
            return {peer for method, peer in upstream.peers if method == "GetModelStatus"}

        wait_for(lambda: len(status_callers()) == 2, "status checks from both workers")

        def changes_since(start: int, serving: bool) -> list[dict[str, object]]:
            return [r for r in gw.readiness_changes()[start:] if r["serving"] is serving]

        before = len(gw.readiness_changes())
        upstream.cut_off.add(sorted(status_callers())[0])
        wait_for(
            lambda: {r["worker"] for r in changes_since(before, False)} == {0, 1},
            "both workers to go NOT_SERVING",
        )
        assert probe_many(gw) == {NOT_SERVING}
        # Only one of them lost the model; the other is not ready because of it.
        down = changes_since(before, False)
        assert sorted(r["model_available"] for r in down) == [False, True]

        before = len(gw.readiness_changes())
        upstream.cut_off.clear()
        wait_for(
            lambda: {r["worker"] for r in changes_since(before, True)} == {0, 1},
            "both workers to be SERVING again",
        )
        assert probe_many(gw) == {SERVING}


def test_with_workers_the_pod_is_ready_as_soon_as_its_last_worker_is(tfs, tmp_path):
    """With a long health interval, the worker that checked first (and found its peer not
    ready yet) does not wait for its next check, a minute later: it looks at its peer's file
    meanwhile."""
    with run_gateway(tfs.target, ["--workers=2", "--health-interval=60"], log_dir=tmp_path) as gw:
        wait_for(lambda: gw.serving_workers() == {0, 1}, "both workers to be SERVING", 20)
        assert probe_many(gw) == {SERVING}
