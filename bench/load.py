"""Load generation with prebuilt request bytes: nothing is built or parsed per call.

- `paired`: one caller alternating two targets call by call (concurrency 1), so both see
  the same machine noise; the paired differences are the second target's extra cost.
- `closed_loop`: `concurrency` callers, each sending its next request as soon as the
  previous one returns, for a fixed time after a warm-up. With h2load (Debian's
  nghttp2-client; a C HTTP/2 load generator) when it is installed: 32 connections of one
  stream each, the prebuilt gRPC body from a file. Otherwise several Python client processes
  (grpc.aio, one channel each), which cost the machine several times more CPU per call.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import numpy as np

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
DETECT = "/detection.v1.DetectionService/Detect"


@dataclass(frozen=True)
class Latencies:
    ms: list[float]
    errors: int = 0
    rate: float = float("nan")  # completed requests per second

    def p(self, q: float) -> float:
        """The q-th percentile in ms; NaN when no call completed (a --quick run on a busy
        machine can end its measuring window before the first answer)."""
        if not self.ms:
            return float("nan")
        return float(np.percentile(np.asarray(self.ms), q))


def paired(
    first: tuple[str, str, bytes], second: tuple[str, str, bytes], calls: int, warmup: int = 30
) -> tuple[Latencies, Latencies, Latencies]:
    """(target, method, body) x 2 -> latencies of each and of second minus first, per pair."""
    channels = [grpc.insecure_channel(t, options=CHANNEL_OPTIONS) for t, _, _ in (first, second)]
    try:
        stubs: list[Callable[[], object]] = []
        for channel, (_, method, body) in zip(channels, (first, second), strict=True):
            stubs.append(partial(channel.unary_unary(method), body, timeout=60))
        for _ in range(warmup):
            for stub in stubs:
                stub()
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(calls):
            for stub, out in zip(stubs, times, strict=True):
                started = time.perf_counter()
                stub()
                out.append((time.perf_counter() - started) * 1e3)
        extra = [b - a for a, b in zip(*times, strict=True)]
        return Latencies(times[0]), Latencies(times[1]), Latencies(extra)
    finally:
        for channel in channels:
            channel.close()


def _client(
    target: str, method: str, body: bytes, tasks: int, begin: float, end: float
) -> tuple[list[float], int]:
    """One client process: `tasks` callers until `end`; latencies of calls started at or
    after `begin` (wall-clock times, shared by all processes)."""

    async def run() -> tuple[list[float], int]:
        latencies: list[float] = []
        errors = 0
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary(method)

            async def caller() -> None:
                nonlocal errors
                while (now := time.time()) < end:
                    started = time.perf_counter()
                    try:
                        await call(body, timeout=60)
                    except grpc.RpcError:
                        errors += now >= begin
                        continue
                    if now >= begin:
                        latencies.append((time.perf_counter() - started) * 1e3)

            await asyncio.gather(*(caller() for _ in range(tasks)))
        return latencies, errors

    return asyncio.run(run())


# "auto": h2load when installed, else the Python clients; bench.__main__ --generator sets it.
GENERATOR = "auto"


def generator() -> str:
    """The load generator closed_loop uses."""
    if GENERATOR != "auto":
        return GENERATOR
    return "h2load" if shutil.which("h2load") else "python"


def closed_loop(
    target: str,
    method: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    warmup: float = 1.0,
    during: Callable[[], None] | None = None,
) -> Latencies:
    """`during` is called repeatedly while the load runs (e.g. to sample RSS)."""
    if generator() == "h2load":
        return _h2load(target, method, body, concurrency, seconds, warmup, during)
    return _python(target, method, body, concurrency, seconds, warmup, during)


def _h2load(
    target: str,
    method: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    warmup: float,
    during: Callable[[], None] | None,
) -> Latencies:
    frame = b"\x00" + len(body).to_bytes(4, "big") + body  # gRPC message frame
    headers = ("content-type: application/grpc", "te: trailers")
    return h2load(f"http://{target}{method}", frame, concurrency, seconds, warmup, headers,
                  during=during)  # fmt: skip


def h2load(
    url: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    warmup: float = 1.0,
    headers: tuple[str, ...] = (),
    http1: bool = False,
    during: Callable[[], None] | None = None,
    requests: int | None = None,
) -> Latencies:
    """h2load POSTing `body` to `url` from `concurrency` connections, one request in flight
    on each (HTTP/2, or HTTP/1.1 keep-alive with `http1`), for `seconds` after `warmup`, or
    until `requests` requests are done (no warm-up then: a count that does not depend on
    how fast the machine is)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "body"
        data.write_bytes(body)
        log = Path(tmp) / "log"
        if requests is None:
            amount = [f"--duration={round(seconds * 1000)}ms",
                      f"--warm-up-time={round(warmup * 1000)}ms"]  # fmt: skip
        else:
            amount = [f"--requests={requests}"]
        command = [
            "h2load", *amount,
            f"--clients={concurrency}", "--max-concurrent-streams=1", "--threads=1",
            *(f"--header={h}" for h in headers), *(["--h1"] if http1 else []),
            f"--data={data}", f"--log-file={log}", url,
        ]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        while process.poll() is None:
            if during is not None:
                during()
            time.sleep(0.2)
        output = process.communicate()[0].decode()
        if process.returncode != 0:
            raise RuntimeError(f"h2load failed:\n{output}")
        ms, errors = [], 0
        for line in log.read_text().splitlines():
            _, status, micros = line.split("\t")
            if status == "200":
                ms.append(int(micros) / 1e3)
            else:
                errors += 1
    # HTTP 200 with a gRPC error status in the trailers also counts as done for h2load;
    # the caller compares with the gateway's own count of OK requests
    # (bench.processes.Gateway.failed_requests).
    failed = re.search(r"(\d+) failed, (\d+) errored, (\d+) timeout", output)
    if failed:
        errors += sum(int(n) for n in failed.groups())
    rate = re.search(r"finished in [^,]+, ([\d.]+) req/s", output)
    return Latencies(ms, errors, float(rate.group(1)) if rate else float("nan"))


def _ready(_: int) -> bool:
    """Run in each client process before the load starts (unpickling it imports us)."""
    return grpc is not None


def _python(
    target: str,
    method: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    warmup: float,
    during: Callable[[], None] | None,
    processes: int = 2,
) -> Latencies:
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    context = multiprocessing.get_context("spawn")  # no fork of a process that has gRPC threads
    with context.Pool(processes) as pool:
        # Each process imports this module (grpc, numpy) before the clock starts: on a loaded
        # machine that can take longer than a short measuring window.
        pool.map(_ready, range(processes))
        begin = time.time() + warmup
        end = begin + seconds
        results = [
            pool.apply_async(_client, (target, method, body, share, begin, end)) for share in shares
        ]
        while time.time() < end:
            if during is not None:
                during()
            time.sleep(0.2)
        outputs = [r.get(timeout=seconds + 120) for r in results]
    latencies = [ms for out, _ in outputs for ms in out]
    return Latencies(latencies, sum(e for _, e in outputs), len(latencies) / seconds)
