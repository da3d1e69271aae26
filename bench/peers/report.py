"""bench.peers' section of bench/results.md from its runs: the targets (issue 30) with
their verdicts, a table per door (each server beside its like-for-like do-nothing proxy) with
the gateway / peer ratios run by run, and each server's footprint."""

from __future__ import annotations

import time

from bench.host import load_average, machine
from bench.peers.runs import Key, Run, Scale
from bench.results import spread, verdict

# Targets (issue 30), judged on concurrency 16 in pixel mode.
CPU_RATIO_TARGET = 0.33  # gateway CPU per request / the best peer's
RATE_RATIO_TARGET = 2.0  # gateway requests/s / the best peer's
FLOOR_RATIO_TARGET = 1.5  # gateway CPU per request, 1920x1080 / its decode alone

GRPC_DOORS = ("gateway gRPC", "seed 002 gRPC", "MLServer gRPC")
HTTP_DOORS = ("gateway HTTP", "KServe REST", "MLServer REST")
PROXY = {"gRPC": "do-nothing proxy gRPC", "HTTP": "do-nothing proxy HTTP"}
SERVER_OF = {
    "gateway gRPC": "gateway",
    "gateway HTTP": "gateway",
    "seed 002 gRPC": "seed 002",
    "KServe REST": "KServe",
    "MLServer REST": "MLServer",
    "MLServer gRPC": "MLServer",
}


def _values(runs: list[Run], key: Key, what: str) -> list[float]:
    return [getattr(r.measures[key], what) for r in runs if key in r.measures]


def _own(runs: list[Run], door: str, image: str, concurrency: int) -> list[float]:
    """The gateway's own µs per request: its CPU per request minus the like-for-like
    do-nothing proxy's, run by run."""
    kind = "gRPC" if door == "gateway gRPC" else "HTTP"
    return [
        r.measures[(door, image, concurrency)].cpu_us
        - r.measures[(PROXY[kind], image, concurrency)].cpu_us
        for r in runs
    ]


def door_tables(runs: list[Run], scale: Scale, kind: str, doors: tuple[str, ...]) -> list[str]:
    ours, peers = doors[0], doors[1:]
    c1, c16 = scale.concurrency[0], scale.concurrency[-1]
    lines = [
        f"| image | server | requests/s, c{c1} | p50 / p99, c{c1} | requests/s, c{c16} "
        f"| p50 / p99, c{c16} | CPU µs per request, c{c1} | CPU µs per request, c{c16} "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for image in scale.images:
        for door in (*doors, PROXY[kind]):
            cells = []
            for c in (c1, c16):
                key = (door, image, c)
                cells.append(spread(_values(runs, key, "rate"), "{:.0f}"))
                cells.append(
                    f"{spread(_values(runs, key, 'p50'))} / {spread(_values(runs, key, 'p99'))} ms"
                )
            cpu = [spread(_values(runs, (door, image, c), "cpu_us"), "{:,.0f}") for c in (c1, c16)]
            errors = sum(sum(_values(runs, (door, image, c), "errors")) for c in (c1, c16))
            lines.append(
                f"| {image} | {door} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} "
                f"| {cpu[0]} | {cpu[1]} | {errors:.0f} |"
            )
    lines += [
        "",
        f"Ratios, gateway / peer, run by run (the gateway's own µs per request over the "
        f"do-nothing {kind} proxy in the same runs beside each):",
        "",
        f"| image | peer | CPU per request, c{c16} | requests/s, c{c16} | CPU per request, c{c1} "
        f"| requests/s, c{c1} | gateway's own µs per request, c{c1} / c{c16} |",
        "|---|---|---|---|---|---|---|",
    ]
    for image in scale.images:
        own = (
            f"{spread(_own(runs, ours, image, c1), '{:,.0f}')} / "
            f"{spread(_own(runs, ours, image, c16), '{:,.0f}')}"
        )
        for peer in peers:
            cells = []
            for c in (c16, c1):
                for what in ("cpu_us", "rate"):
                    mine = _values(runs, (ours, image, c), what)
                    theirs = _values(runs, (peer, image, c), what)
                    ratios = [
                        m / t if t else float("nan") for m, t in zip(mine, theirs, strict=True)
                    ]
                    cells.append(spread(ratios, "{:.2f}x"))
            lines.append(f"| {image} | {peer} | {' | '.join(cells)} | {own} |")
    return lines


def footprint(runs: list[Run]) -> list[str]:
    lines = [
        "| server | start to first correct answer | RSS idle | RSS under load (most seen) |",
        "|---|---|---|---|",
    ]
    for name in ("gateway", "seed 002", "KServe", "MLServer"):
        ready = [r.ready[name] for r in runs]
        idle = [r.idle_rss[name] for r in runs]
        most = [r.load_rss[name] for r in runs]
        lines.append(
            f"| {name} | {spread(ready)} s | {spread(idle, '{:.0f}')} MiB "
            f"| {spread(most, '{:.0f}')} MiB |"
        )
    return lines


def targets(runs: list[Run], scale: Scale) -> list[str]:
    c16 = scale.concurrency[-1]
    lines = ["| target | measured | |", "|---|---|---|"]
    for kind, doors in (("gRPC", GRPC_DOORS), ("HTTP", HTTP_DOORS)):
        ours, peers = doors[0], doors[1:]
        for image in scale.images:
            cpu_ratios, rate_ratios, best_cpu, best_rate = [], [], [], []
            for r in runs:
                peer_cpu = {p: r.measures[(p, image, c16)].cpu_us for p in peers}
                peer_rate = {p: r.measures[(p, image, c16)].rate for p in peers}
                cheapest = min(peer_cpu, key=peer_cpu.__getitem__)
                fastest = max(peer_rate, key=peer_rate.__getitem__)
                best_cpu.append(cheapest)
                best_rate.append(fastest)
                cpu_ratios.append(r.measures[(ours, image, c16)].cpu_us / peer_cpu[cheapest])
                rate_ratios.append(r.measures[(ours, image, c16)].rate / peer_rate[fastest])
            own = spread(_own(runs, ours, image, c16), "{:,.0f}")
            lines.append(
                f"| {kind} door, {image}, c{c16}: CPU per request <= {CPU_RATIO_TARGET}x the best "
                f"peer's | {spread(cpu_ratios, '{:.2f}x')} of {_names(best_cpu)} (gateway's own: "
                f"{own} µs per request) | {verdict(cpu_ratios, lambda v: v <= CPU_RATIO_TARGET)} |"
            )
            lines.append(
                f"| {kind} door, {image}, c{c16}: requests/s >= {RATE_RATIO_TARGET:g}x the best "
                f"peer's | {spread(rate_ratios, '{:.2f}x')} of {_names(best_rate)} (gateway's "
                f"own: {own} µs per request) "
                f"| {verdict(rate_ratios, lambda v: v >= RATE_RATIO_TARGET)} |"
            )
    big = "JPEG 1920x1080"
    if big in scale.images:
        for door in ("gateway gRPC", "gateway HTTP"):
            ratios = [r.measures[(door, big, c16)].cpu_us / r.floor[big] for r in runs]
            floors = spread([r.floor[big] for r in runs], "{:,.0f}")
            lines.append(
                f"| {door}, {big}, c{c16}: CPU per request <= {FLOOR_RATIO_TARGET}x the decode "
                f"floor ({floors} µs) | {spread(ratios, '{:.2f}x')} "
                f"| {verdict(ratios, lambda v: v <= FLOOR_RATIO_TARGET)} |"
            )
    return lines


def floor_breakdown(runs: list[Run], scale: Scale) -> list[str]:
    """Where each gateway door's CPU per request goes at the largest image and c16, run by
    run: the decode floor, the like-for-like proxy's transport of the same pixel request, and
    the gateway's own beyond both; against them the floor target's budget."""
    big, c16 = scale.images[-1], scale.concurrency[-1]
    lines = []
    for door, kind in (("gateway gRPC", "gRPC"), ("gateway HTTP", "HTTP")):
        if (door, big, c16) not in runs[0].measures:
            continue
        floor = [r.floor[big] for r in runs]
        proxy = [r.measures[(PROXY[kind], big, c16)].cpu_us for r in runs]
        total = [r.measures[(door, big, c16)].cpu_us for r in runs]
        own = [t - f - p for t, f, p in zip(total, floor, proxy, strict=True)]
        base = [f + p for f, p in zip(floor, proxy, strict=True)]
        budget = [FLOOR_RATIO_TARGET * f for f in floor]
        lines.append(
            f"- {door}, {big}, c{c16}: {spread(total, '{:,.0f}')} µs of CPU per request = "
            f"the decode floor {spread(floor, '{:,.0f}')} µs + the do-nothing proxy's "
            f"{spread(proxy, '{:,.0f}')} µs (receiving the JPEG, sending the same pixel "
            f"request) + {spread(own, '{:,.0f}')} µs of its own; {FLOOR_RATIO_TARGET}x the "
            f"floor is {spread(budget, '{:,.0f}')} µs, decode + the proxy's transport alone "
            f"{spread(base, '{:,.0f}')} µs "
            f"({spread([b / f for b, f in zip(base, floor, strict=True)], '{:.2f}x')} the floor)."
        )
    return lines


def _names(names: list[str]) -> str:
    return " / ".join(dict.fromkeys(names))


def report(runs: list[Run], scale: Scale, started: float, load_before: str) -> str:
    amount = (
        f"{scale.seconds:g} s after {scale.warmup:g} s of warm-up"
        if scale.requests is None
        else f"{scale.requests} requests"
    )
    floors = "; ".join(
        f"{image} {spread([r.floor[image] for r in runs], '{:,.0f}')} µs" for image in scale.images
    )
    return "\n".join(
        [
            "## Against what users would pick instead (bench/peers)",
            "",
            f"`python -m bench.peers` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{time.monotonic() - started:.0f} s: {machine()}. Load average {load_before} "
            f"before, {load_average()} after. Pixel mode (every server decodes the JPEG and "
            f"sends uint8 pixels to bench/upstream.py), h2load for {amount} per figure (HTTP/2 for "
            "gRPC, HTTP/1.1 keep-alive for HTTP; c = connections, one request in flight on "
            f"each); {scale.runs} runs, each starting every process anew, given as "
            '"median (min to max)". CPU per request: user + system seconds of the serving '
            "process and its children (MLServer's inference worker) over the requests that "
            "reached the upstream. Every server's answer (boxes in pixels, labels, scores) "
            "was checked against the bench upstream's outputs before it was measured.",
            "",
            "The peers (bench/peers/): seed 002's synchronous grpcio gateway (Pillow, "
            "`tf.make_tensor_proto`, the official stub, `np.array(float_val)`; 10 threads, "
            "as gRPC's examples); a KServe 0.21 custom transformer (`kserve.Model`, "
            "`kserve.ModelServer` with its defaults; `preprocess`/`postprocess` plain "
            "functions as its docs write them, `predict` calling TF Serving's gRPC Predict "
            "through the official stub on grpc.aio); an MLServer 1.7 custom runtime "
            "(`mlserver.MLModel`, MLServer's defaults: inference in one worker process; the "
            "same Predict call). The do-nothing proxies (bench/proxy.py, grpc.aio and "
            "aiohttp as the gateway's doors) receive what the gateway receives and forward "
            "its pixel request unread. Decode floor (libjpeg-turbo alone, CPU per decode, "
            f"same runs): {floors}.",
            "",
            "### Targets",
            "",
            *targets(runs, scale),
            "",
            "Where the CPU goes, run by run (each figure: median (min to max) over the runs):",
            "",
            *floor_breakdown(runs, scale),
            "",
            "### gRPC door: Detect, seed 002's Detect, MLServer's ModelInfer (image as BYTES)",
            "",
            *door_tables(runs, scale, "gRPC", GRPC_DOORS),
            "",
            "### HTTP door: JSON with the image in base64 (gateway `:detect`, KServe v1 "
            "`:predict`, MLServer v2 `/infer`)",
            "",
            *door_tables(runs, scale, "HTTP", HTTP_DOORS),
            "",
            "### Footprint (the gateway serves both doors from one process; so does MLServer, "
            "with its worker)",
            "",
            *footprint(runs),
            "",
        ]
    )
