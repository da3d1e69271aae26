"""`python -m bench.http`: the HTTP door against the gRPC door of the same gateway process,
on the same canned upstream (bench/upstream.py), in one run -> a section of bench/results.md.

1. concurrency 1: one caller alternating three calls per round (the upstream directly with
   the prebuilt PredictRequest the gateway would send, gRPC Detect, HTTP POST :detect), so
   all three see the same machine noise; overhead = gateway call - direct call, per round.
   HTTP bodies: the raw JPEG, JSON (base64) and MessagePack.
2. concurrency 32: Python closed-loop clients (grpc.aio for gRPC, aiohttp for HTTP; the same
   number of processes and callers), and the gateway's CPU time per request.
3. footprint: start to ready (gRPC health SERVING / HTTP /ping 200) and idle RSS, with the
   HTTP door on and off.

Targets (the HTTP door issue): HTTP p50 overhead within 1.3x of gRPC's at concurrency 1,
HTTP throughput at least 0.7x of gRPC's at 32; with both doors on, start to ready <= 1 s and
idle RSS <= 100 MB. `--quick` runs a tiny version (the smoke test); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import msgpack

from bench import load, photos, results
from bench.calls import LIMITS
from bench.host import cpu_seconds, load_average, machine, rss_mib
from bench.http_load import http_closed_loop
from bench.processes import ROOT, free_port, is_serving, stop_process, upstream
from bench.results import RESULTS
from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.domain import ModelRef
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.detection import REQUIRED_OUTPUTS
from gateway.upstream.client import PREDICT, request_envelope

MODEL = "encoded"  # string mode: the image is forwarded, so the doors' own cost shows
TITLE = "## HTTP door against the gRPC door (bench/http.py)"
OVERHEAD_RATIO_TARGET = 1.3
THROUGHPUT_RATIO_TARGET = 0.7
START_TARGET = 1.0  # seconds
IDLE_RSS_TARGET = 100.0  # MB


@dataclass(frozen=True)
class Scale:
    rounds: int
    load_seconds: float
    start_runs: int


FULL = Scale(rounds=400, load_seconds=8.0, start_runs=5)
QUICK = Scale(rounds=5, load_seconds=1.0, start_runs=1)


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    target: str
    http_port: int
    ready_after: float  # seconds from start to gRPC SERVING and /ping 200 (both doors)


def _ping(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def gateway(up: str, http: bool = True) -> Iterator[Gateway]:
    port, http_port = free_port(), free_port() if http else 0
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
         f"--http-port={http_port}", f"--upstream={up}", f"--model={MODEL}",
         "--metrics-port=0"],
        cwd=ROOT, stderr=subprocess.DEVNULL,  # INFO request logs to /dev/null
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        while not (is_serving(target) and (not http or _ping(http_port))):
            if process.poll() is not None or time.perf_counter() - started > 60:
                raise RuntimeError("gateway did not become ready")
            time.sleep(0.005)
        yield Gateway(process, target, http_port, time.perf_counter() - started)
    finally:
        stop_process(process)


def percentile(values: list[float], q: float) -> float:
    return load.Latencies(values).p(q) if values else float("nan")


# --- 1. concurrency 1 -----------------------------------------------------------------------


def bodies(jpeg: bytes) -> dict[str, tuple[str, bytes]]:
    """HTTP body per kind: (Content-Type, body)."""
    return {
        "raw JPEG": ("image/jpeg", jpeg),
        "JSON": (
            "application/json",
            json.dumps({"image": base64.b64encode(jpeg).decode()}).encode(),
        ),
        "MessagePack": ("application/x-msgpack", msgpack.packb({"image": jpeg})),
    }


def latency(up: str, gw: Gateway, jpeg: bytes, rounds: int) -> tuple[list[str], dict[str, float]]:
    envelope = request_envelope(ModelRef(MODEL), REQUIRED_OUTPUTS)
    direct_body = build_input(
        jpeg, InputPlan("input_tensor", InputMode.ENCODED), envelope, LIMITS
    ).request
    grpc_body = pb.DetectRequest(
        image=jpeg, model=model_pb2.ModelSpec(name=MODEL)
    ).SerializeToString()
    http_bodies = bodies(jpeg)
    path = f"/v1/models/{MODEL}:detect"
    options = load.CHANNEL_OPTIONS
    with (
        grpc.insecure_channel(up, options=options) as c1,
        grpc.insecure_channel(gw.target, options=options) as c2,
    ):
        direct = c1.unary_unary(PREDICT)
        detect = c2.unary_unary(load.DETECT)
        conn = http.client.HTTPConnection("127.0.0.1", gw.http_port, timeout=60)

        def post(kind: str) -> None:
            content_type, body = http_bodies[kind]
            conn.request(
                "POST", path, body, {"Content-Type": content_type, "Accept": "application/json"}
            )
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")

        calls: dict[str, Callable[[], object]] = {
            "direct": lambda: direct(direct_body, timeout=60),
            "gRPC": lambda: detect(grpc_body, timeout=60),
            **{f"HTTP {kind}": (lambda kind=kind: post(kind)) for kind in http_bodies},  # type: ignore[misc]
        }
        for _ in range(30):
            for call in calls.values():
                call()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                started = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - started) * 1e3)
        conn.close()
    added = {
        name: [t - d for t, d in zip(times[name], times["direct"], strict=True)]
        for name in calls
        if name != "direct"
    }
    lines = [
        "| call | p50 / p99 | added to direct, p50 (paired) | added / gRPC's added |",
        "|---|---|---|---|",
        f"| upstream directly (prebuilt PredictRequest) | {percentile(times['direct'], 50):.2f} / "
        f"{percentile(times['direct'], 99):.2f} ms | — | — |",
    ]
    grpc_added = percentile(added["gRPC"], 50)
    facts = {"grpc-added": grpc_added}
    for name, extra in added.items():
        ratio = percentile(extra, 50) / grpc_added if grpc_added > 0 else float("nan")
        facts[f"{name}-ratio"] = ratio
        label = name if name == "gRPC" else f"{name} body"
        p50, p99 = percentile(times[name], 50), percentile(times[name], 99)
        lines.append(
            f"| gateway, {label} | {p50:.2f} / {p99:.2f} ms "
            f"| {percentile(extra, 50):+.2f} ms | {ratio:.2f}x |"
        )
    return lines, facts


# --- 2. concurrency 32 ----------------------------------------------------------------------


def throughput(gw: Gateway, jpeg: bytes, seconds: float) -> tuple[list[str], dict[str, float]]:
    grpc_body = pb.DetectRequest(
        image=jpeg, model=model_pb2.ModelSpec(name=MODEL)
    ).SerializeToString()
    url = f"http://127.0.0.1:{gw.http_port}/v1/models/{MODEL}:detect"
    runs: dict[str, Callable[[], load.Latencies]] = {
        "gRPC": lambda: load._python(gw.target, load.DETECT, grpc_body, 32, seconds, 1.0, None),
        "HTTP raw JPEG": lambda: http_closed_loop(url, "image/jpeg", jpeg, 32, seconds),
    }
    lines = [
        "| door | requests/s | p50 / p99 | errors | gateway CPU per request |",
        "|---|---|---|---|---|",
    ]
    facts: dict[str, float] = {}
    # gRPC, HTTP, HTTP, gRPC: a load spike from elsewhere is less likely to hit one side only.
    for name in ("gRPC", "HTTP raw JPEG", "HTTP raw JPEG", "gRPC"):
        cpu_before = cpu_seconds([gw.process.pid])
        result = runs[name]()
        cpu = cpu_seconds([gw.process.pid]) - cpu_before
        done = len(result.ms) or 1
        # The CPU time also covers the 1 s warm-up, whose requests are not counted.
        per_request = cpu / (done * (seconds + 1.0) / seconds) * 1e3
        facts.setdefault(f"rate-{name}", 0.0)
        facts[f"rate-{name}"] += result.rate / 2
        facts.setdefault(f"cpu-{name}", 0.0)
        facts[f"cpu-{name}"] += per_request / 2
        lines.append(
            f"| {name} | {result.rate:.0f} | {percentile(result.ms, 50):.2f} / "
            f"{percentile(result.ms, 99):.2f} ms "
            f"| {result.errors} | {per_request:.2f} ms |"
        )
    return lines, facts


# --- 3. footprint ---------------------------------------------------------------------------


def footprint(up: str, runs: int) -> tuple[list[str], dict[str, float]]:
    measured: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
    for _ in range(runs):
        for http_on in (False, True):
            with gateway(up, http=http_on) as gw:
                measured[http_on][0].append(gw.ready_after)
                time.sleep(1.0)  # settle: first health check done, nothing in flight
                measured[http_on][1].append(rss_mib(gw.process.pid))
    lines = ["| gateway | start to ready (median) | idle RSS (max) |", "|---|---|---|"]
    facts: dict[str, float] = {}
    for http_on, (starts, rss) in measured.items():
        median = sorted(starts)[len(starts) // 2]
        what = (
            "gRPC + HTTP doors (ready: SERVING and /ping 200)"
            if http_on
            else "gRPC door only (`--http-port=0`)"
        )
        lines.append(
            f"| {what} | {median:.2f} s | {max(rss):.0f} MiB ({max(rss) * 1.048576:.0f} MB) |"
        )
        facts[f"start-{http_on}"] = median
        facts[f"rss-{http_on}"] = max(rss) * 1.048576
    return lines, facts


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def write(out: Path, section: list[str]) -> None:
    """Replaces this benchmark's section of results.md; leaves the rest."""
    results.write_section(out, "http", "\n".join(section))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    jpeg = photos.load()["JPEG 640x480"]
    load_before = load_average()
    started = time.monotonic()
    with upstream() as up:
        print("1. concurrency 1 ...", flush=True)
        with gateway(up) as gw:
            latency_lines, facts = latency(up, gw, jpeg, scale.rounds)
            print("2. concurrency 32 ...", flush=True)
            throughput_lines, more = throughput(gw, jpeg, scale.load_seconds)
            facts |= more
        print("3. footprint ...", flush=True)
        footprint_lines, more = footprint(up, scale.start_runs)
        facts |= more
    overhead_ratio = facts["HTTP raw JPEG-ratio"]
    grpc_added = facts["grpc-added"]
    http_rate, grpc_rate = facts["rate-HTTP raw JPEG"], facts["rate-gRPC"]
    rate_ratio = http_rate / grpc_rate
    section = [
        TITLE,
        "",
        f"`python -m bench.http` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{time.monotonic() - started:.0f} s: {machine()}. Load average {load_before} before, "
        f"{load_average()} after. One gateway process with both doors, `--model={MODEL}` (string "
        "mode: the JPEG 640x480 is forwarded, so the doors' own cost is what differs), upstream "
        "bench/upstream.py; gateway, upstream and clients share the 2 cores.",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| HTTP `:detect` p50 overhead <= {OVERHEAD_RATIO_TARGET}x the gRPC door's "
        f"(concurrency 1, raw JPEG body) | {overhead_ratio:.2f}x "
        f"(+{grpc_added * overhead_ratio:.2f} ms vs +{grpc_added:.2f} ms) "
        f"| {verdict(overhead_ratio <= OVERHEAD_RATIO_TARGET)} |",
        f"| HTTP throughput >= {THROUGHPUT_RATIO_TARGET}x gRPC's (concurrency 32) "
        f"| {rate_ratio:.2f}x ({http_rate:.0f} vs {grpc_rate:.0f} requests/s, means of two "
        f"runs) | {verdict(rate_ratio >= THROUGHPUT_RATIO_TARGET)} |",
        f"| start to ready <= {START_TARGET:.0f} s, both doors | {facts['start-True']:.2f} s "
        f"| {verdict(facts['start-True'] <= START_TARGET)} |",
        f"| idle RSS <= {IDLE_RSS_TARGET:.0f} MB, both doors | {facts['rss-True']:.0f} MB "
        f"| {verdict(facts['rss-True'] <= IDLE_RSS_TARGET)} |",
        "",
        "The gateway's CPU time per request at concurrency 32 is the steadier comparison on a "
        "shared machine (requests/s also move with the load generators and everything else on "
        f"the 2 cores): HTTP {facts['cpu-HTTP raw JPEG']:.2f} ms, gRPC {facts['cpu-gRPC']:.2f} ms "
        f"({facts['cpu-HTTP raw JPEG'] / facts['cpu-gRPC']:.2f}x). Start to ready with the HTTP "
        "door adds importing aiohttp to the gRPC-only start (both in the footprint below).",
        "",
        f"### Concurrency 1 ({scale.rounds} rounds of direct, gRPC and HTTP calls; Python "
        "clients: grpcio, http.client with keep-alive)",
        "",
        *latency_lines,
        "",
        "### Concurrency 32 (Python closed-loop clients in 2 processes, "
        f"{scale.load_seconds:.0f} s each after 1 s warm-up; grpc.aio and aiohttp)",
        "",
        *throughput_lines,
        "",
        "### Footprint",
        "",
        *footprint_lines,
        "",
    ]
    write(args.out, section)
    print("\n".join(section))


if __name__ == "__main__":
    main()
