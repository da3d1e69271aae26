"""The processes a bench run starts and waits for, on OS-picked loopback ports: the bench
upstream (bench/upstream.py), the do-nothing proxy (bench/proxy.py) and the gateway."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    target: str
    metrics_port: int
    serving_after: float  # seconds from process start to health SERVING

    def failed_requests(self) -> int:
        """Requests the gateway answered with an error, from its metrics. CANCELLED is left
        out: h2load cancels the streams in flight when its time is up."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        found = re.findall(r'^vision_gateway_requests_total\{code="(\w+)".*\} (\S+)$', text, re.M)
        return int(sum(float(n) for code, n in found if code not in ("OK", "CANCELLED")))

    def batch_counts(self, model: str) -> tuple[float, float]:
        """(Predict calls, images) sent to `model` so far, from the batch size histogram."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        found = {
            kind: sum(float(v) for v in re.findall(
                rf'^vision_gateway_upstream_batch_size_{kind}\{{model="{model}"\}} (\S+)$',
                text, re.M,
            ))
            for kind in ("count", "sum")
        }  # fmt: skip
        return found["count"], found["sum"]

    def pids(self) -> list[int]:
        """The processes serving requests: the workers under a supervisor, else itself."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        found = [int(p) for p in children.read_text().split()] if children.exists() else []
        return found or [self.process.pid]


def is_serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def upstream(delay_ms: float = 0.0) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.upstream", f"--port={port}", f"--delay-ms={delay_ms}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with grpc.insecure_channel(target) as channel:
                try:
                    grpc.channel_ready_future(channel).result(timeout=1)
                    break
                except grpc.FutureTimeoutError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise RuntimeError("bench upstream did not start") from None
        yield target
    finally:
        stop_process(process)


@dataclass
class Proxy:
    process: subprocess.Popen[bytes]
    target: str


@contextmanager
def proxy(upstream_target: str, send: bytes | None = None, typed: bool = False) -> Iterator[Proxy]:
    """bench/proxy.py: a grpc.aio pass-through, the floor of a Python gRPC gateway. With
    `send`, it forwards those bytes in place of what it receives (like for like: callers
    send it what they send the gateway, and it sends upstream what the gateway sends)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "bench.proxy", f"--port={port}",
                   f"--upstream={upstream_target}"]  # fmt: skip
        if send is not None:
            (Path(tmp) / "send").write_bytes(send)
            command.append(f"--send={Path(tmp) / 'send'}")
        if typed:
            command.append("--typed")
        process = subprocess.Popen(command, cwd=ROOT)
        target = f"127.0.0.1:{port}"
        try:
            with grpc.insecure_channel(target) as channel:
                grpc.channel_ready_future(channel).result(timeout=60)
            yield Proxy(process, target)
        finally:
            stop_process(process)


@contextmanager
def gateway(
    upstream_target: str,
    workers: int = 1,
    model_config: str | None = None,
    model: str = "pixels",
) -> Iterator[Gateway]:
    port, metrics_port = free_port(), free_port()
    tmp = tempfile.TemporaryDirectory()
    extra = []
    if model_config is not None:
        (Path(tmp.name) / "models.toml").write_text(model_config)
        extra.append(f"--model-config={Path(tmp.name) / 'models.toml'}")
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
         f"--upstream={upstream_target}", f"--model={model}", f"--metrics-port={metrics_port}",
         f"--workers={workers}", "--http-port=0", *extra],
        cwd=ROOT, stderr=subprocess.DEVNULL,  # INFO request logs (the default) to /dev/null
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        while not is_serving(target):
            if process.poll() is not None or time.perf_counter() - started > 60:
                raise RuntimeError("gateway did not become SERVING")
            time.sleep(0.005)
        serving_after = time.perf_counter() - started
        # The first worker to listen answers health; load must not start before all listen,
        # or every connection it opens lands on the first one.
        while listeners(port) < workers:
            if process.poll() is not None or time.perf_counter() - started > 60:
                raise RuntimeError("gateway workers did not all listen")
            time.sleep(0.005)
        yield Gateway(process, target, metrics_port, serving_after)
    finally:
        stop_process(process)
        tmp.cleanup()


def listeners(port: int) -> int:
    """Sockets listening on `port` (each gateway worker has its own, SO_REUSEPORT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count
