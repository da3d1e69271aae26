"""One run of bench.peers: every server started anew, each door under h2load at each
concurrency for each image (its requests/s, latency, and CPU per request that reached the
upstream), the decode floor, each server's start-to-ready time and RSS."""

from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import simplejpeg

from bench import load
from bench import upstream as bench_upstream
from bench.peers.servers import (
    Door,
    Images,
    Server,
    check_answers,
    gateway,
    kserve,
    mlserver,
    proxies,
    seed002,
    wait_ready,
)


@dataclass(frozen=True)
class Scale:
    runs: int
    seconds: float  # of measured load per (server, image, concurrency)
    warmup: float
    images: tuple[str, ...]
    concurrency: tuple[int, ...] = (1, 16)
    # Servers started one at a time (start to ready measured alone), or all at once.
    start_alone: bool = True
    requests: int | None = None  # per figure instead of `seconds` (and no warm-up)


FULL = Scale(runs=3, seconds=5.0, warmup=1.0, images=("JPEG 640x480", "JPEG 1920x1080"))
QUICK = Scale(
    runs=1, seconds=0.0, warmup=0.0, images=("JPEG 640x480",), start_alone=False, requests=32
)


@dataclass(frozen=True)
class Measure:
    rate: float  # requests/s (h2load, measured window)
    p50: float
    p99: float
    cpu_us: float  # CPU of the serving tree per request that reached the upstream
    errors: int


def measure(up: str, server: Server, door: Door, image: str, concurrency: int,
            scale: Scale) -> Measure:  # fmt: skip
    def sample() -> None:
        server.load_rss = max(server.load_rss, server.process.rss_mib())

    server.process.check_alive()
    cpu_before, (calls_before, _) = server.process.cpu_seconds(), bench_upstream.stats(up)
    body = door.bodies[image]
    if not door.http1:  # gRPC: one length-prefixed message frame
        body = b"\x00" + len(body).to_bytes(4, "big") + body
    result = load.h2load(door.url, body, concurrency, scale.seconds, scale.warmup, door.headers,
                         door.http1, during=sample, requests=scale.requests)  # fmt: skip
    cpu = server.process.cpu_seconds() - cpu_before
    calls = bench_upstream.stats(up)[0] - calls_before
    server.process.check_alive()
    return Measure(result.rate, result.p(50), result.p(99), cpu / max(calls, 1) * 1e6,
                   result.errors)  # fmt: skip


def decode_floor(images: Images, repeat: int = 30) -> dict[str, float]:
    """µs of CPU (this thread) per libjpeg-turbo decode of each image, alone: the least any
    server in pixel mode spends per request."""
    floors = {}
    for name, data in images.data.items():
        simplejpeg.decode_jpeg(data, colorspace="RGB")
        times = []
        for _ in range(repeat):
            started = time.thread_time()
            simplejpeg.decode_jpeg(data, colorspace="RGB")
            times.append(time.thread_time() - started)
        floors[name] = statistics.median(times) * 1e6
    return floors


Key = tuple[str, str, int]  # door label, image, concurrency


@dataclass
class Run:
    measures: dict[Key, Measure] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    idle_rss: dict[str, float] = field(default_factory=dict)
    load_rss: dict[str, float] = field(default_factory=dict)
    floor: dict[str, float] = field(default_factory=dict)


def one_run(up: str, images: Images, scale: Scale, number: int) -> Run:
    run = Run(floor=decode_floor(images))
    with tempfile.TemporaryDirectory() as name, ExitStack() as stack:
        tmp = Path(name)
        servers = []
        for start in (gateway, seed002, kserve, mlserver):
            servers.append(start(stack, up, images, tmp))
            if scale.start_alone:
                wait_ready(servers[-1], images)
        for server in servers:
            wait_ready(server, images)  # at once when not started alone
        time.sleep(1.0)  # settle: nothing in flight
        for server in servers:
            run.ready[server.name] = server.ready_after
            run.idle_rss[server.name] = server.process.rss_mib()
        for image, data in images.data.items():
            for server in servers:
                check_answers(server, images, image)
            with proxies(up, image, data, tmp) as proxied:
                everyone = servers + proxied
                # Rotated each run, so a slow spell of the machine lands on another server.
                shift = number % len(everyone)
                everyone = everyone[shift:] + everyone[:shift]
                for concurrency in scale.concurrency:
                    for server in everyone:
                        for door in server.doors:
                            key = (door.label, image, concurrency)
                            run.measures[key] = measure(up, server, door, image, concurrency,
                                                        scale)  # fmt: skip
                            print(f"  run {number + 1} {key}: {run.measures[key]}", flush=True)
        for server in servers:
            run.load_rss[server.name] = server.load_rss
    return run
