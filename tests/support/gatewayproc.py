"""Runs the gateway as a real subprocess (`python -m gateway`) on a loopback port for tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from tests.support.localserver import START_ATTEMPTS, free_port, reserve_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "detection.v1.DetectionService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
]


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log_path: Path
    http_port: int = 0  # 0: the HTTP door is off (run_gateway(..., http=True) turns it on)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.target, options=CHANNEL_OPTIONS)

    def stub(self, channel: grpc.Channel) -> pb_grpc.DetectionServiceStub:
        return pb_grpc.DetectionServiceStub(channel)

    def health(self, service: str = "") -> int:
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            return int(response.status)

    def wait_health(self, status: int, service: str = "", timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"gateway exited:\n{self.log_path.read_text()}")
            try:
                last = self.health(service)
                if last == status:
                    return
            except grpc.RpcError as e:
                last = e.code()
            time.sleep(0.1)
        raise AssertionError(f"health of {service!r} stayed {last}, wanted {status}")

    def in_flight(self) -> float:
        """The gateway's own count of images in flight, from its metrics endpoint."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read()
        match = re.search(rb"^vision_gateway_in_flight_requests (\S+)$", text, re.MULTILINE)
        if match is None:
            raise AssertionError(f"no vision_gateway_in_flight_requests in {url}")
        return float(match.group(1))

    def records(self) -> list[dict[str, Any]]:
        """The gateway's JSON log lines. Its batch runners' processes write to the same file,
        so a line may hold two records whose writes met (1 of 20 runs of
        tests/jobs/control/test_races.py), and the last one may be still being written."""
        decoder = json.JSONDecoder()
        found = []
        for line in self.log_path.read_text().splitlines():
            at = 0
            while line.startswith("{", at):
                try:
                    record, at = decoder.raw_decode(line, at)
                except json.JSONDecodeError:
                    break
                found.append(record)
        return found

    def readiness_changes(self) -> list[dict[str, Any]]:
        """The "readiness changed" log lines, oldest first (with --workers each names its
        worker)."""
        return [r for r in self.records() if r.get("message") == "readiness changed"]

    def serving_workers(self) -> set[int]:
        """The workers whose latest readiness change says SERVING (with --workers)."""
        latest: dict[int, bool] = {}
        for record in self.readiness_changes():
            latest[record["worker"]] = record["serving"] is True
        return {worker for worker, serving in latest.items() if serving}

    def stop(self, timeout: float = 60.0) -> int:
        return stop_process(self.process, timeout)


# The gateway's startup line names the address it bound: `"address":"127.0.0.1:PORT"`.
_LISTENING = re.compile(rb'"message":"gateway listening",[^\n]*?"address":"[^"]*:(\d+)"')


def _bound_port(process: subprocess.Popen[bytes], log_path: Path, timeout: float) -> int:
    """The port the gateway bound, from its "gateway listening" log line."""
    deadline = time.monotonic() + timeout
    while True:
        match = _LISTENING.search(log_path.read_bytes())
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            raise AssertionError(f"gateway exited before listening:\n{log_path.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"gateway did not listen in {timeout} s:\n{log_path.read_text()}")
        time.sleep(0.02)


def with_path(root: Path) -> dict[str, str]:
    """The environment for a process that runs `root`'s code, whatever its working directory
    (python -m puts only the working directory first on the path)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    }


@contextmanager
def run_gateway(
    upstream: str,
    args: Sequence[str] = (),
    log_dir: Path | None = None,
    wait_ready: bool = True,
    http: bool = False,
    root: Path = ROOT,
) -> Iterator[GatewayProcess]:
    """Starts `python -m gateway` on 127.0.0.1 and yields it once it listens (and, with
    `wait_ready`, once health is SERVING); always stops it.

    Ports: the gRPC port is 0 (the OS picks a free one, read back from the startup log).
    `--workers` needs a fixed gRPC port, and the HTTP door a fixed one: those are held with
    reserve_port() while the gateway runs (both bind with SO_REUSEPORT, so a port merely
    found free could be shared silently with another test's gateway). The metrics port is
    bound without SO_REUSEPORT: a collision stops the gateway at startup, and then it is
    started again on new ports. `root` is the checkout whose `gateway` package runs (a copy
    with a task added: tests/support/newtask.py).
    """
    workers = any(a.startswith("--workers") and a not in ("--workers=1",) for a in args)
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    for attempt in range(START_ATTEMPTS):
        with ExitStack() as ports:
            fixed_port = ports.enter_context(reserve_port()) if workers else 0
            http_port = ports.enter_context(reserve_port()) if http else 0
            gateway = _start(upstream, args, log_dir, fixed_port, free_port(), http_port, root)
            try:
                if not fixed_port:
                    gateway.port = _bound_port(gateway.process, gateway.log_path, timeout=120)
                if wait_ready:
                    gateway.wait_health(SERVING, SERVICE)
            except AssertionError:
                gateway.stop()
                if attempt + 1 < START_ATTEMPTS and _port_taken(gateway):
                    continue
                raise
            try:
                yield gateway
            finally:
                gateway.stop()
            return


def _port_taken(gateway: GatewayProcess) -> bool:
    return b"Address already in use" in gateway.log_path.read_bytes()


def _start(
    upstream: str,
    args: Sequence[str],
    log_dir: Path,
    port: int,
    metrics_port: int,
    http_port: int,
    root: Path = ROOT,
) -> GatewayProcess:
    log_path = Path(tempfile.mkstemp(prefix="gateway-", suffix=".log", dir=log_dir)[1])
    command = [
        sys.executable, "-m", "gateway",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--metrics-port={metrics_port}",
        f"--upstream={upstream}",
        "--health-interval=0.3",
        f"--http-port={http_port}",  # off unless asked: tests run gateways side by side
        "--log-level=INFO",  # the startup line names the bound port (a later flag wins)
        *args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=root, env=with_path(root), stdout=log, stderr=subprocess.STDOUT
        )
    return GatewayProcess(process, port, metrics_port, log_path, http_port)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, in KiB (Linux /proc)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values
