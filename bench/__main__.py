"""`python -m bench` (`make bench`): every measurement of issue 4 in one run -> bench/results.md.

1. request building: TF Serving's client recipe vs the gateway vs the decode floor;
2. gateway overhead: the same client calling the gateway vs the upstream directly, with an
   equivalent prebuilt request, at concurrency 1 and 32, pixel and string mode;
3. throughput at concurrency 32 with 1 and 2 gateway worker processes;
4. footprint: start to SERVING, RSS idle and under load, bytes sent upstream per image.

The upstream is bench/upstream.py (fixed OD outputs, microseconds per call), so the gateway's
own cost is what differs between the direct and the gateway path. `--quick` runs everything
on a small scale (the smoke test uses it); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import building, load, photos
from gateway.core.domain import ModelRef
from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.imaging import images
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.tasks.detection import REQUIRED_OUTPUTS
from gateway.upstream.client import PREDICT, request_envelope

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.md"
LIMITS = images.ImageLimits(max_bytes=64 * 1024 * 1024, max_pixels=50_000_000)
MODES = {"string": ("encoded", InputMode.ENCODED), "pixel": ("pixels", InputMode.PIXELS)}


@dataclass(frozen=True)
class Scale:
    building_repeat: int
    paired_calls: int
    load_seconds: float
    start_runs: int


FULL = Scale(building_repeat=25, paired_calls=400, load_seconds=8.0, start_runs=5)
QUICK = Scale(building_repeat=2, paired_calls=5, load_seconds=0.5, start_runs=1)


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
        found = re.findall(
            r'^detection_gateway_requests_total\{code="(\w+)".*\} (\S+)$', text, re.M
        )
        return int(sum(float(n) for code, n in found if code not in ("OK", "CANCELLED")))

    def pids(self) -> list[int]:
        """The processes serving requests: the workers under a supervisor, else itself."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        found = [int(p) for p in children.read_text().split()] if children.exists() else []
        return found or [self.process.pid]


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def upstream() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.upstream", f"--port={port}"],
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
        _stop(process)


@contextmanager
def proxy(upstream_target: str) -> Iterator[str]:
    """bench/proxy.py: a grpc.aio pass-through, the floor of a Python gRPC gateway."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.proxy", f"--port={port}", f"--upstream={upstream_target}"],
        cwd=ROOT,
    )
    target = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        yield target
    finally:
        _stop(process)


@contextmanager
def gateway(upstream_target: str, workers: int = 1) -> Iterator[Gateway]:
    port, metrics_port = free_port(), free_port()
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
         f"--upstream={upstream_target}", "--model=pixels", f"--metrics-port={metrics_port}",
         f"--workers={workers}", "--http-port=0"],
        cwd=ROOT, stderr=subprocess.DEVNULL,  # INFO request logs (the default) to /dev/null
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        while not _serving(target):
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
        _stop(process)


def listeners(port: int) -> int:
    """Sockets listening on `port` (each gateway worker has its own, SO_REUSEPORT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of the processes so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return (
        f"{os.cpu_count()} vCPU ({model}), {int(mem) / 1024 / 1024:.1f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def load_average() -> str:
    return " / ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- sections -----------------------------------------------------------------------------

Facts = dict[str, float]


def overhead(
    up: str, gw: Gateway, pass_through: str | None, jpegs: dict[str, bytes], scale: Scale
) -> tuple[list[str], Facts]:
    lines = [
        "| mode | image | concurrency | direct p50 / p99 | gateway p50 / p99 "
        "| added p50 | requests/s direct / gateway | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    facts: Facts = {}
    for mode, (model, input_mode) in MODES.items():
        envelope = request_envelope(ModelRef(model), REQUIRED_OUTPUTS)
        for name, data in jpegs.items():
            direct_body = build_input(
                data, InputPlan("input_tensor", input_mode), envelope, LIMITS
            ).request
            gateway_body = pb.DetectRequest(
                image=data, model=pb.ModelSpec(name=model)
            ).SerializeToString()
            direct_call = (up, PREDICT, direct_body)
            gateway_call = (gw.target, load.DETECT, gateway_body)
            direct, through, added = load.paired(direct_call, gateway_call, scale.paired_calls)
            facts[f"added-{mode}-{name}"] = added.p(50)
            lines.append(
                f"| {mode} | {name} | 1 | {direct.p(50):.2f} / {direct.p(99):.2f} ms "
                f"| {through.p(50):.2f} / {through.p(99):.2f} ms "
                f"| {added.p(50):+.2f} ms (paired) | — | 0 |"
            )
            if pass_through is not None:
                # The same prebuilt request through a do-nothing grpc.aio proxy.
                _, proxied, floor = load.paired(
                    direct_call, (pass_through, PREDICT, direct_body), scale.paired_calls
                )
                facts[f"proxy-{mode}-{name}"] = floor.p(50)
                lines.append(
                    f"| {mode}, via bench/proxy.py (grpc.aio pass-through) | {name} | 1 | "
                    f"| {proxied.p(50):.2f} / {proxied.p(99):.2f} ms "
                    f"| {floor.p(50):+.2f} ms (paired) | — | 0 |"
                )
            if not name.endswith("640x480"):
                continue
            failed_before = gw.failed_requests()
            d = load.closed_loop(up, PREDICT, direct_body, 32, scale.load_seconds)
            g = load.closed_loop(gw.target, load.DETECT, gateway_body, 32, scale.load_seconds)
            errors = g.errors + gw.failed_requests() - failed_before
            lines.append(
                f"| {mode} | {name} | 32 | {d.p(50):.2f} / {d.p(99):.2f} ms "
                f"| {g.p(50):.2f} / {g.p(99):.2f} ms | {g.p(50) - d.p(50):+.2f} ms "
                f"| {d.rate:.0f} / {g.rate:.0f} | {d.errors + errors} |"
            )
    return lines, facts


def throughput(up: str, jpeg: bytes, scale: Scale) -> tuple[list[str], Facts]:
    """Runs in the order 1, 2, 2, 1 workers per mode, so a load spike from elsewhere on the
    shared machine is less likely to land on one side only; each row is one run."""
    lines = [
        "| mode | workers | requests/s | p50 / p99 | errors | CPU cores used: gateway "
        "/ everything else on the machine | gateway RSS max (per process) |",
        "|---|---|---|---|---|---|---|",
    ]
    facts: Facts = {}
    for mode in ("pixel", "string"):
        model = MODES[mode][0]
        body = pb.DetectRequest(image=jpeg, model=pb.ModelSpec(name=model)).SerializeToString()
        rates: dict[int, list[float]] = {1: [], 2: []}
        for workers in (1, 2, 2, 1):
            with gateway(up, workers) as gw:
                pids = gw.pids()
                peak: dict[int, float] = dict.fromkeys(pids, 0.0)

                def sample(pids: list[int] = pids, peak: dict[int, float] = peak) -> None:
                    for pid in pids:
                        peak[pid] = max(peak[pid], rss_mib(pid))

                failed_before = gw.failed_requests()
                gateway_before, machine_before = cpu_seconds(pids), machine_busy()
                started = time.monotonic()
                result = load.closed_loop(
                    gw.target, load.DETECT, body, 32, scale.load_seconds, during=sample
                )
                wall = time.monotonic() - started
                gateway_cores = (cpu_seconds(pids) - gateway_before) / wall
                other_cores = (machine_busy() - machine_before) / wall - gateway_cores
                errors = result.errors + gw.failed_requests() - failed_before
            rates[workers].append(result.rate)
            facts[f"cores-gateway-{mode}-{workers}"] = gateway_cores
            facts[f"cores-other-{mode}-{workers}"] = other_cores
            facts[f"rss-load-{mode}-{workers}"] = max(
                facts.get(f"rss-load-{mode}-{workers}", 0.0), *peak.values()
            )
            lines.append(
                f"| {mode} | {workers} | {result.rate:.0f} | {result.p(50):.1f} / "
                f"{result.p(99):.1f} ms | {errors} | {gateway_cores:.2f} / "
                f"{other_cores:.2f} | {max(peak.values()):.0f} MiB |"
            )
        for workers, values in rates.items():
            facts[f"rate-{mode}-{workers}"] = sum(values) / len(values)
    return lines, facts


def machine_busy() -> float:
    """CPU seconds spent by everything on the machine (all cores), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


def footprint(up: str, jpegs: dict[str, bytes], scale: Scale) -> tuple[list[str], Facts]:
    starts, idle = [], []
    for _ in range(scale.start_runs):
        with gateway(up) as gw:
            starts.append(gw.serving_after)
            time.sleep(1.0)  # settle: first health check done, nothing in flight
            idle.append(rss_mib(gw.process.pid))
    with gateway(up, workers=2) as gw:
        two_start = gw.serving_after
        time.sleep(1.0)
        worker_idle = max(rss_mib(pid) for pid in gw.pids())
        supervisor = rss_mib(gw.process.pid)
    start = sorted(starts)[len(starts) // 2]
    lines = [
        "| what | value |",
        "|---|---|",
        f"| start to health SERVING, 1 process (median of {len(starts)} starts) "
        f"| {start:.2f} s (min {min(starts):.2f} s, max {max(starts):.2f} s) |",
        f"| start to health SERVING, `--workers 2` (first worker) | {two_start:.2f} s |",
        f"| idle RSS, 1 process | {max(idle):.0f} MiB |",
        f"| idle RSS, `--workers 2` | {worker_idle:.0f} MiB per worker; supervisor "
        f"{supervisor:.0f} MiB |",
    ]
    facts: Facts = {"start": start, "idle": max(idle, default=0), "idle-worker": worker_idle}
    for name, data in jpegs.items():
        for mode, (model, input_mode) in MODES.items():
            envelope = request_envelope(ModelRef(model), REQUIRED_OUTPUTS)
            sent = len(
                build_input(data, InputPlan("input_tensor", input_mode), envelope, LIMITS).request
            )
            facts[f"sent-{mode}-{name}"] = sent / len(data)
            lines.append(
                f"| bytes sent upstream per image, {mode} mode, {name} ({len(data):,} B) "
                f"| {sent:,} B ({sent / len(data):.3f}x the JPEG) |"
            )
    return lines, facts


def targets(rows: list[building.Row], facts: Facts) -> list[str]:
    """Issue 4's targets, each with the value measured above."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = ["| target | measured | |", "|---|---|---|"]
    worst = min(rows, key=lambda r: r.recipe_ms / r.gateway_ms)
    speedup = worst.recipe_ms / worst.gateway_ms
    # The gateway has to decode too: recipe / decode floor bounds what any gateway can reach.
    lines.append(
        f"| request building >= 3x faster than the recipe at every size | {speedup:.2f}x at "
        f"worst ({worst.name}; there recipe / decode floor is "
        f"{worst.recipe_ms / worst.floor_ms:.2f}x, the most any path that decodes can gain) "
        f"| {verdict(speedup >= 3)} |"
    )
    to_floor = max(r.gateway_ms / r.floor_ms for r in rows)
    lines.append(
        f"| request building within 1.15x of the decode floor | {to_floor:.3f}x at worst "
        f"| {verdict(to_floor <= 1.15)} |"
    )
    small = next(r for r in rows if r.name == "JPEG 640x480")
    string_added = facts["added-string-JPEG 640x480"]
    pixel_added = facts["added-pixel-JPEG 640x480"]
    proxy = {m: facts.get(f"proxy-{m}-JPEG 640x480", float("nan")) for m in MODES}
    lines.append(
        f"| string mode, concurrency 1: <= 1 ms added to the direct p50 (640x480) "
        f"| {string_added:+.2f} ms (a do-nothing grpc.aio proxy: {proxy['string']:+.2f} ms) "
        f"| {verdict(string_added <= 1.0)} |"
    )
    lines.append(
        f"| pixel mode, concurrency 1: <= decode floor + 1 ms added (640x480: "
        f"{small.floor_ms:.2f} + 1 ms) | {pixel_added:+.2f} ms (do-nothing proxy: "
        f"{proxy['pixel']:+.2f} ms) | {verdict(pixel_added <= small.floor_ms + 1.0)} |"
    )
    scaling = facts["rate-pixel-2"] / facts["rate-pixel-1"]
    lines.append(
        f"| 2 workers >= 1.6x the throughput of 1, pixel mode (section 3) | {scaling:.2f}x "
        f"| {verdict(scaling >= 1.6)} |"
    )
    lines.append(
        f"| start to SERVING <= 1 s | {facts['start']:.2f} s | {verdict(facts['start'] <= 1)} |"
    )
    idle = max(facts["idle"], facts["idle-worker"])
    lines.append(
        f"| idle RSS <= 80 MB per worker | {idle * 1.048576:.0f} MB ({idle:.0f} MiB) "
        f"| {verdict(idle * 1.048576 <= 80)} |"
    )
    sent = max(v for k, v in facts.items() if k.startswith("sent-string"))
    lines.append(
        f"| string mode sends <= 1.01x the JPEG's size | {sent:.4f}x at worst "
        f"| {verdict(sent <= 1.01)} |"
    )
    return lines


def notes(rows: list[building.Row], facts: Facts) -> list[str]:
    """Why a target is out of reach on this machine, from the measurements above."""
    bounds = ", ".join(f"{r.name} {r.recipe_ms / r.floor_ms:.2f}x" for r in rows)
    small = next(r for r in rows if r.name == "JPEG 640x480")
    pixel_floor = facts["proxy-pixel-JPEG 640x480"] + small.floor_ms
    one = facts["cores-gateway-pixel-1"]  # last run of each (the ABBA order's outer runs)
    two = facts["cores-gateway-pixel-2"]
    other = facts["cores-other-pixel-2"]
    return [
        f"- Request building vs the recipe: the gateway has to decode too, so its speed-up "
        f"cannot exceed recipe / decode floor: {bounds}. Small JPEGs and PNG (zlib) are "
        "dominated by decoding, which the recipe does about as fast.",
        f"- Added latency: one extra `grpc.aio` hop in Python (bench/proxy.py, no work at all) "
        f"already adds {facts['proxy-string-JPEG 640x480']:+.2f} ms with the JPEG and "
        f"{facts['proxy-pixel-JPEG 640x480']:+.2f} ms with the 0.9 MB pixel request; with "
        f"the decode floor that is {pixel_floor:.2f} ms for pixel mode, against the "
        f"gateway's {facts['added-pixel-JPEG 640x480']:+.2f} ms.",
        f"- Workers: one worker already used {one:.2f} cores in pixel mode (decoding runs in "
        f"threads outside the GIL), and the upstream and load generator (plus anything else "
        f"running) {other:.2f}; two workers can have at most the {2 - other:.2f} cores left, "
        f"so at most {(2 - other) / one:.2f}x here. They used {two:.2f}. 1.6x needs the "
        "gateway on cores of its own.",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    parser.add_argument(
        "--generator",
        choices=("auto", "h2load", "python"),
        default="auto",
        help="load generator for concurrency 32 (auto: h2load when installed)",
    )
    args = parser.parse_args(argv)
    load.GENERATOR = args.generator
    scale = QUICK if args.quick else FULL
    all_photos = photos.load()
    if args.quick:  # the smallest image only
        all_photos = {k: v for k, v in all_photos.items() if "640x480" in k}
    jpegs = {k: v for k, v in all_photos.items() if k.startswith("JPEG") and "4032" not in k}
    load_before = load_average()
    started = time.monotonic()

    print("1. request building ...", flush=True)
    rows, parse_us = building.run(all_photos, scale.building_repeat)
    with upstream() as up:
        print("2. gateway overhead ...", flush=True)
        with gateway(up) as gw, proxy(up) as pass_through:
            overhead_lines, facts = overhead(up, gw, pass_through, jpegs, scale)
        print("3. throughput ...", flush=True)
        throughput_lines, more = throughput(up, all_photos["JPEG 640x480"], scale)
        facts |= more
        print("4. footprint ...", flush=True)
        footprint_lines, more = footprint(up, jpegs, scale)
        facts |= more
    generator = load.generator()
    report = [
        "# Benchmark results",
        "",
        f"`python -m bench` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{time.monotonic() - started:.0f} s: {machine()}. Load average (1/5/15 min) "
        f"{load_before} before, {load_average()} after; the machine is shared, and everything "
        "below (gateway, upstream, load generator) runs on the same 2 cores.",
        "",
        "## Targets (issue 4)",
        "",
        *targets(rows, facts),
        "",
        "Where a target is out of reach here:",
        "",
        *notes(rows, facts),
        "",
        "## 1. Request building (encoded bytes in, serialized PredictRequest out)",
        "",
        *building.table(rows, parse_us),
        "",
        "## 2. Gateway overhead (fast upstream: bench/upstream.py, fixed OD outputs)",
        "",
        "Direct: the same client sends the equivalent prebuilt PredictRequest (what the "
        "gateway would send) straight to the upstream. Concurrency 1: one caller alternating "
        f"direct and gateway calls, {scale.paired_calls} pairs, Python gRPC client; "
        f"concurrency 32: load generator `{generator}`, {scale.load_seconds:.0f} s each.",
        "",
        *overhead_lines,
        "",
        f"## 3. Throughput at concurrency 32 (640x480 JPEG, `{generator}`, "
        f"{scale.load_seconds:.0f} s each)",
        "",
        *throughput_lines,
        "",
        "2 workers / 1 worker (means of the two runs each): pixel mode "
        f"{facts['rate-pixel-2'] / facts['rate-pixel-1']:.2f}x, string mode "
        f"{facts['rate-string-2'] / facts['rate-string-1']:.2f}x.",
        "",
        "## 4. Footprint",
        "",
        *footprint_lines,
        "",
    ]
    text = "\n".join(report)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
