"""`python -m bench` (`make bench`): the gateway's benchmarks in one run -> bench/results.md.

1. request building: TF Serving's client recipe (in both glibc allocator states) vs the
   gateway vs the decode floor, each state in a fresh process (bench.recipe);
2. gateway overhead: the same client calling the gateway vs the upstream directly, with an
   equivalent prebuilt request, and a like-for-like do-nothing proxy, at concurrency 1
   (3 runs) and 32, pixel and string mode; CPU per request, gateway vs proxy (3 runs);
3. throughput at concurrency 32 with 1 and 2 gateway worker processes;
4. footprint: start to SERVING, RSS idle, bytes per image counted where they arrive;
5. `max_side` on a 12 MP photo: bytes at the upstream, and the gateway end to end against
   the client recipe calling the upstream directly.

The upstream is bench/upstream.py (fixed OD outputs, microseconds per call), so the gateway's
own cost is what differs between the direct and the gateway path. Only this command's
section of bench/results.md is replaced (bench.results). `--quick` runs everything on a
small scale (the smoke test uses it); its numbers mean nothing. The real-model figures come
from `python -m bench.realmodel`. Each section is a module of bench/sections/; the processes
they start are bench/processes.py's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from bench import load, photos, results
from bench.calls import MODES
from bench.host import load_average, machine
from bench.processes import gateway, upstream
from bench.results import RESULTS
from bench.sections import FULL, QUICK
from bench.sections.building import building_section
from bench.sections.footprint import footprint, max_side
from bench.sections.overhead import concurrency_32, overhead
from bench.sections.targets import notes, targets
from bench.sections.throughput import throughput


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
    big_name = max(
        (k for k in all_photos if k.startswith("JPEG")), key=lambda k: len(all_photos[k])
    )
    big = all_photos[big_name]
    load_before = load_average()
    started = time.monotonic()

    print("1. request building ...", flush=True)
    building_lines, facts = building_section(all_photos, scale)
    with upstream() as up:
        print("2. gateway overhead ...", flush=True)
        with gateway(up) as gw:
            overhead_lines, more = overhead(up, gw, jpegs, scale)
            facts |= more
            c32_lines, more = concurrency_32(up, gw, all_photos["JPEG 640x480"], scale)
            facts |= more
        print("3. throughput ...", flush=True)
        throughput_lines, more = throughput(up, all_photos["JPEG 640x480"], scale)
        facts |= more
        print("4. footprint ...", flush=True)
        footprint_lines, more = footprint(up, jpegs, scale)
        facts |= more
        print("5. max_side ...", flush=True)
        max_side_lines, more = max_side(up, big_name, big, scale)
        facts |= more
    generator = load.generator()
    rates = {m: facts[f"rates-{m}"] for m in MODES}
    report = [
        "# Benchmark results",
        "",
        f"`python -m bench` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{time.monotonic() - started:.0f} s: {machine()}. Load average (1/5/15 min) "
        f"{load_before} before, {load_average()} after; the machine is shared, and everything "
        "below (gateway, upstream, load generator) runs on the same 2 cores. Figures given as "
        f'"median (min to max)" are {scale.rounds} repeated runs; a target is met only when '
        "every run meets it.",
        "",
        "## Targets",
        "",
        *targets(facts, big_name, len(big)),
        "",
        "Where a target is out of reach here:",
        "",
        *notes(facts),
        "",
        "## 1. Request building (encoded bytes in, serialized PredictRequest out)",
        "",
        *building_lines,
        "",
        "## 2. Gateway overhead (fast upstream: bench/upstream.py, fixed OD outputs)",
        "",
        "Direct: the same client sends the equivalent prebuilt PredictRequest (what the "
        "gateway sends) straight to the upstream. Concurrency 1: one caller alternating "
        f"direct and gateway (or proxy) calls, {scale.paired_calls} pairs per run, "
        f"{scale.rounds} runs, Python gRPC client. The do-nothing proxy (bench/proxy.py "
        "`--send`) is like for like: it receives the DetectRequest the gateway receives "
        "and forwards the PredictRequest the gateway would send, unread.",
        "",
        *overhead_lines,
        "",
        f"Concurrency 32, 640x480 JPEG, load generator `{generator}`, "
        f"{scale.load_seconds:.0f} s each; then CPU per request, string mode: process CPU "
        "seconds (user + system, /proc) over the requests that reached the upstream, gateway "
        f"and proxies alternating in {scale.cpu_slices} slices of "
        f"{scale.load_seconds / scale.cpu_slices:.0f} "
        "s per run (CPU and requests summed per process over the slices), each run on a "
        "new gateway and new proxies (processes started alike differ by up to 4.5 %). The typed "
        "do-nothing proxy (`bench/proxy.py --typed`) serves "
        "detection.v1 Detect as a typed service (parses the DetectRequest and the "
        "PredictResponse, answers a fixed five-detection DetectionResult): what gRPC costs a "
        "typed Python gateway, so gateway minus typed proxy is the gateway's own work:",
        "",
        *c32_lines,
        "",
        f"## 3. Throughput at concurrency 32 (640x480 JPEG, `{generator}`, "
        f"{scale.load_seconds:.0f} s each)",
        "",
        *throughput_lines,
        "",
        "2 workers / 1 worker (means of the two runs each): pixel mode "
        f"{statistics.mean(rates['pixel'][2]) / statistics.mean(rates['pixel'][1]):.2f}x, "
        f"string mode "
        f"{statistics.mean(rates['string'][2]) / statistics.mean(rates['string'][1]):.2f}x.",
        "",
        "## 4. Footprint",
        "",
        *footprint_lines,
        "",
        f"## 5. `max_side`: {big_name} ({len(big):,} B), bench upstream",
        "",
        *max_side_lines,
        "",
    ]
    text = "\n".join(report)
    results.write_section(args.out, "bench", text)
    print(text)


if __name__ == "__main__":
    main()
