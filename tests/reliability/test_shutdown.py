"""Shutdown: what callers see around SIGTERM.

- health checks sent in the very instant of SIGTERM get an answer, never silence until
  their deadline (the race is repeated 200 times, on gateways forked from a fork server);
- Watch streams see NOT_SERVING during the drain and do not hold the drain open;
- when the grace runs out, calls still in flight are cut, and the gateway exits.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from tests.reliability.conftest import Figures, scaled
from tests.support.faultupstream import FaultyUpstream
from tests.support.forkserver import ForkServer
from tests.support.gatewayproc import NOT_SERVING, GatewayProcess, run_gateway
from tests.support.localserver import HOST, LocalServer

OK = grpc.StatusCode.OK
# A probe that gets no answer waits this long: far beyond any answer (milliseconds, seconds
# on a machine loaded with 8 gateways starting and stopping at once), so a DEADLINE_EXCEEDED
# means the gateway left it hanging, not that the machine was slow.
PROBE_DEADLINE = 60.0
PROBES = 3  # per gateway, each on new connections until refused
# Answers a health check may get in the instant of SIGTERM: the status (SERVING before the
# signal is handled, NOT_SERVING after), UNAVAILABLE once the server refuses new calls, or
# CANCELLED for a call gRPC's core had received but not yet handed to the servicer when
# the server shut down (it cancels those at once).
# Answers a probe may get around SIGTERM. UNIMPLEMENTED: a call that reaches gRPC's server
# core in the instant it stops, before a handler is matched, is refused with it (the soak
# sees a few over 1,000 gateways and reports their details); like UNAVAILABLE it is an
# immediate answer, and a kubelet or Envoy probe counts it as a failure, which is right for
# a stopping pod.
ANSWERS = {"SERVING", "NOT_SERVING", "UNAVAILABLE", "CANCELLED", "UNIMPLEMENTED"}
# The details of every error answer other than UNAVAILABLE and CANCELLED, for the report.
ODD_DETAILS: Counter[str] = Counter()


@pytest.fixture
def faulty(tfs: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(tfs.target) as upstream:
        yield upstream


def check(target: str) -> str:
    """One health check on a new connection: its status or its error code, by name."""
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=PROBE_DEADLINE
            )
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                ODD_DETAILS[f"{e.code().name}: {e.details()}"] += 1
            return str(e.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def sigterm_race(
    forks: ForkServer, upstream: str, log_dir: Path, index: int, probes: int = PROBES
) -> Counter[str]:
    """One gateway, raced twice: health probes on new connections run while SIGTERM
    arrives (the drain starts: NOT_SERVING) and on while the drain ends and the server stops
    (refused), each until it is refused. An open DetectStream keeps the drain going until
    the test ends it, so both instants fall among running probes; a probe left hanging
    by either would wait for its deadline."""
    child = forks.start(
        [
            f"--host={HOST}",
            "--port=0",
            "--metrics-port=0",
            f"--upstream={upstream}",
            # Checks TF Serving each second: on a busy machine the first check can fail.
            "--health-interval=1",
            "--shutdown-grace=60",
        ],
        log_dir / f"race-{index}.log",
    )
    target = f"{HOST}:{child.wait_listening()}"
    deadline = time.monotonic() + 60
    while check(target) != "SERVING":  # SERVING before the signal, NOT_SERVING after
        assert time.monotonic() < deadline, child.log()
        time.sleep(0.02)
    frames: queue.Queue[pb.DetectRequest | None] = queue.Queue()

    def no_frames() -> Iterator[pb.DetectRequest]:
        while (frame := frames.get()) is not None:
            yield frame

    answers: Counter[str] = Counter()
    lock = threading.Lock()
    answered = threading.Event()
    signalled = threading.Event()
    draining = threading.Event()

    def probe() -> None:
        while True:
            answer = check(target)
            with lock:
                answers[answer] += 1
            answered.set()
            if answer == "NOT_SERVING" and signalled.is_set():
                draining.set()
            if answer not in ("SERVING", "NOT_SERVING", "CANCELLED"):
                return  # refused (UNAVAILABLE), or a failure the test reports

    with grpc.insecure_channel(target) as channel:
        stream = pb_grpc.DetectionServiceStub(channel).DetectStream(no_frames(), timeout=120)
        # A window of frames (empty: per-image errors, the stream goes on) and the first
        # answer: the stream is in the gateway's hands, so the drain will wait for it.
        for _ in range(4):  # --stream-window's default: results flow once it is full
            frames.put(pb.DetectRequest(image=b""))
        assert next(stream).error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        threads = [threading.Thread(target=probe) for _ in range(probes)]
        for thread in threads:
            thread.start()
        # The probes are running: now SIGTERM lands among them.
        assert answered.wait(PROBE_DEADLINE * 2), "no probe was answered"
        signalled.set()
        child.signal(signal.SIGTERM)
        assert draining.wait(PROBE_DEADLINE * 3), (dict(answers), child.log())
        frames.put(None)  # the stream ends, the drain with it: the server stops
        with contextlib.suppress(grpc.RpcError):
            list(stream)
        for thread in threads:
            thread.join(PROBE_DEADLINE * 3)
        assert not any(t.is_alive() for t in threads), "a probe was never refused"
    code = child.wait_exit(60)
    assert code == 0, (code, child.log())
    return answers


def test_health_checks_in_the_instant_of_sigterm_are_answered(
    faulty: FaultyUpstream, tmp_path: Path, figures: Figures
) -> None:
    """200 gateways (about 20 s: forked, 8 at a time) each raced at SIGTERM and at the
    end of the drain; every probe gets an answer, none waits for its deadline."""
    rounds = scaled(200, 1000)
    started = time.monotonic()
    with ForkServer() as forks, ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(lambda i: sigterm_race(forks, faulty.target, tmp_path, i), range(rounds))
        )
    elapsed = time.monotonic() - started
    total: Counter[str] = Counter()
    for answers in results:
        total.update(answers)
    figures.record(
        "health_checks_at_sigterm",
        gateways=rounds,
        answers=dict(total),
        other_errors=dict(ODD_DETAILS),
        seconds=round(elapsed, 1),
    )
    assert set(total) <= ANSWERS, total  # DEADLINE_EXCEEDED would mean a hang
    # Every round probed through both instants: SERVING before SIGTERM, NOT_SERVING in the
    # drain, and each of its probes refused once the server stopped (UNAVAILABLE, or
    # UNIMPLEMENTED in the instant it stops).
    for answers in results:
        refused = answers["UNAVAILABLE"] + answers["UNIMPLEMENTED"]
        assert answers["SERVING"] and answers["NOT_SERVING"] and refused == PROBES, answers


def watch(target: str, updates: queue.Queue[str]) -> None:
    """Health Watch on "": every status into `updates`, then "END" (or the error code)."""
    with grpc.insecure_channel(target) as channel:
        try:
            for response in health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(), timeout=120
            ):
                updates.put(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
            updates.put("END")
        except grpc.RpcError as e:
            updates.put(e.code().name)


def test_the_drain_says_not_serving_refuses_new_calls_and_ends_watches(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    grace = 60.0
    with run_gateway(faulty.target, [f"--shutdown-grace={grace}"], log_dir=tmp_path) as gw:
        with gw.channel() as channel:
            gw.stub(channel).Detect(request_small, timeout=60)  # signature cached
        updates: queue.Queue[str] = queue.Queue()
        watcher = threading.Thread(target=watch, args=(gw.target, updates))
        watcher.start()
        assert updates.get(timeout=60) == "SERVING"
        faulty.hold()
        held: list[grpc.StatusCode] = []
        caller = threading.Thread(target=lambda: held.append(detect_code(gw, request_small)))
        caller.start()
        faulty.wait_active(1)
        signalled = time.monotonic()
        gw.process.send_signal(signal.SIGTERM)
        # The watcher hears NOT_SERVING and its stream ends, while the request is held.
        assert updates.get(timeout=60) == "NOT_SERVING"
        assert updates.get(timeout=60) == "END"
        # During the drain health checks answer NOT_SERVING and new calls are refused.
        assert gw.health("") == NOT_SERVING
        refused = detect_error(gw, request_small)
        assert faulty.active == 1
        faulty.release()
        caller.join(120)
        code = gw.process.wait(grace + 30)
        exited = time.monotonic() - signalled
    assert refused[0] == grpc.StatusCode.UNAVAILABLE and "shutting down" in refused[1]
    assert held == [OK]
    assert code == 0 and exited < grace  # the watcher did not hold the drain open


def detect_error(gw: GatewayProcess, request: pb.DetectRequest) -> tuple[grpc.StatusCode, str]:
    with gw.channel() as channel:
        try:
            gw.stub(channel).Detect(request, timeout=30)
            return OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""


def detect_code(gw: GatewayProcess, request: pb.DetectRequest) -> grpc.StatusCode:
    return detect_error(gw, request)[0]


def test_when_the_grace_runs_out_calls_in_flight_are_cut_and_the_gateway_exits(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    with run_gateway(faulty.target, ["--shutdown-grace=1"], log_dir=tmp_path) as gw:
        with gw.channel() as channel:
            gw.stub(channel).Detect(request_small, timeout=60)
        faulty.hold()
        held: list[grpc.StatusCode] = []
        callers = [
            threading.Thread(target=lambda: held.append(detect_code(gw, request_small)))
            for _ in range(2)
        ]
        for caller in callers:
            caller.start()
        faulty.wait_active(2)
        signalled = time.monotonic()
        gw.process.send_signal(signal.SIGTERM)
        for caller in callers:
            caller.join(120)
        code = gw.process.wait(60)
        exited = time.monotonic() - signalled
        # The held upstream calls were cancelled with them.
        deadline = time.monotonic() + 60
        while faulty.active and time.monotonic() < deadline:
            time.sleep(0.05)
        faulty.release()
    assert set(held) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}, held
    assert len(held) == 2
    assert exited >= 1.0  # not before the grace
    assert code == 0
    assert faulty.active == 0 and faulty.cancelled == 2
    [warning] = [r for r in gw.records() if r["message"] == "grace period over; cancelling calls"]
    assert warning["in_flight"] == 2
