"""Runs the gateway as a real subprocess (`python -m gateway`) on a loopback port for tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from tests.localserver import free_port, stop_process

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

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

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
        match = re.search(rb"^detection_gateway_in_flight_requests (\S+)$", text, re.MULTILINE)
        if match is None:
            raise AssertionError(f"no detection_gateway_in_flight_requests in {url}")
        return float(match.group(1))

    def records(self) -> list[dict[str, Any]]:
        """The gateway's JSON log lines."""
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def stop(self, timeout: float = 60.0) -> int:
        return stop_process(self.process, timeout)


@contextmanager
def run_gateway(
    upstream: str, args: Sequence[str] = (), log_dir: Path | None = None, wait_ready: bool = True
) -> Iterator[GatewayProcess]:
    port, metrics_port = free_port(), free_port()
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log_path = log_dir / f"gateway-{port}.log"
    command = [
        sys.executable, "-m", "gateway",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--metrics-port={metrics_port}",
        f"--upstream={upstream}",
        "--health-interval=0.3",
        *args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    gateway = GatewayProcess(process, port, metrics_port, log_path)
    try:
        if wait_ready:
            gateway.wait_health(SERVING, SERVICE)
        yield gateway
    finally:
        gateway.stop()
