"""`--workers N`: N gateway processes sharing one port, supervised by this process.

Python runs one thread of Python at a time, so one process tops out near one core of gRPC
and protobuf work. Each worker is a full gateway (`python -m gateway ... --workers=1`) that
binds the same port with SO_REUSEPORT (gRPC's default on Linux); the kernel spreads new
connections over them. The supervisor itself runs no gRPC:

- metrics: workers write prometheus_client's multiprocess files into a private directory and
  serve no port; the supervisor serves their sum on GATEWAY_METRICS_PORT.
- health: each worker checks TF Serving itself and publishes its readiness into the same
  directory (gateway.readiness.WorkerGroup); a worker answers SERVING only while every
  worker listens and sees the model AVAILABLE, so any worker's answer is the pod's.
- SIGTERM/SIGINT: forwarded to every worker, which drains within GATEWAY_SHUTDOWN_GRACE; the
  supervisor exits when all have exited (code 0 only if every worker's was 0).
- a worker that dies on its own stops the others and fails the supervisor (exit 1), so the
  orchestrator restarts the pod instead of running on with part of its capacity.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from types import FrameType

from gateway.config import Settings
from gateway.readiness import GROUP_COUNT_ENV, GROUP_DIR_ENV, GROUP_INDEX_ENV

log = logging.getLogger("gateway.workers")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Beyond the grace the workers get, time to exit (stop the server, close channels).
EXIT_MARGIN_SECONDS = 10.0


def worker_command(argv: Sequence[str]) -> list[str]:
    """The worker's command line: the supervisor's own flags, then overrides (last wins)."""
    return [sys.executable, "-m", "gateway", *argv, "--workers=1", "--metrics-port=0"]


def supervise(settings: Settings, argv: Sequence[str]) -> int:
    """Runs settings.workers workers until they exit; returns the exit code."""
    from gateway import metrics

    directory = tempfile.mkdtemp(prefix="gateway-metrics-")
    ready_dir = os.path.join(directory, "ready")
    os.mkdir(ready_dir)
    env = {
        **os.environ,
        MULTIPROC_ENV: directory,
        GROUP_DIR_ENV: ready_dir,
        GROUP_COUNT_ENV: str(settings.workers),
    }
    workers: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index in range(settings.workers):
            worker_env = {**env, GROUP_INDEX_ENV: str(index)}
            workers.append(subprocess.Popen(worker_command(argv), env=worker_env))
            if stopping:  # a signal arrived while starting: stop the latest one too
                workers[-1].send_signal(signal.SIGTERM)
        log.info(
            "workers started",
            extra={
                "fields": {"workers": [worker.pid for worker in workers], "port": settings.port}
            },
        )
        metrics.serve_multiprocess(settings.metrics_port, settings.host, directory)
        failed = _wait(workers, lambda: stopping)
        if failed is not None:
            log.error(
                "a worker exited; stopping the others",
                extra={"fields": {"pid": failed.pid, "code": failed.returncode}},
            )
            stop(signal.SIGTERM, None)
        deadline = time.monotonic() + settings.shutdown_grace + EXIT_MARGIN_SECONDS
        codes = [_reap(worker, deadline) for worker in workers]
        if failed is not None:
            return 1
        return 0 if all(code == 0 for code in codes) else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _wait(
    workers: list[subprocess.Popen[bytes]], stopping: Callable[[], bool]
) -> subprocess.Popen[bytes] | None:
    """Until a stop signal (None) or a worker exiting on its own (that worker)."""
    while not stopping():
        for worker in workers:
            if worker.poll() is not None:
                return None if stopping() else worker
        time.sleep(0.1)
    return None


def _reap(worker: subprocess.Popen[bytes], deadline: float) -> int:
    try:
        return worker.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        log.error("worker did not exit in time; killing it", extra={"fields": {"pid": worker.pid}})
        worker.kill()
        return worker.wait()
