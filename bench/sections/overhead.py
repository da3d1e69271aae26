"""Section 2: what the gateway adds to a direct call at concurrency 1 (against a like-for-like
do-nothing proxy), direct against gateway at concurrency 32, and the CPU each request costs
the gateway and the proxies."""

from __future__ import annotations

from bench import load
from bench import upstream as bench_upstream
from bench.calls import MODES, detect_body, predict_body
from bench.host import cpu_seconds
from bench.processes import Gateway, gateway, proxy
from bench.results import spread
from bench.sections import Facts, Scale
from gateway.upstream.client import PREDICT


def overhead(
    up: str, gw: Gateway, jpegs: dict[str, bytes], scale: Scale
) -> tuple[list[str], Facts]:
    lines = [
        "| mode | image | direct p50 | gateway p50 | proxy p50 | added p50: gateway "
        "| added p50: do-nothing proxy (like for like) |",
        "|---|---|---|---|---|---|---|",
    ]
    facts: Facts = {}
    for mode, (model, _) in MODES.items():
        for name, data in jpegs.items():
            direct_body = predict_body(data, mode)
            gateway_body = detect_body(data, model)
            direct_call = (up, PREDICT, direct_body)
            rounds: list[tuple[float, ...]] = []
            # The proxy receives the caller's DetectRequest bytes (as the gateway does) and
            # sends the PredictRequest the gateway would send.
            with proxy(up, send=direct_body) as px:
                for _ in range(scale.rounds):
                    direct, through, added = load.paired(
                        direct_call, (gw.target, load.DETECT, gateway_body), scale.paired_calls
                    )
                    _, proxied, floor = load.paired(
                        direct_call, (px.target, PREDICT, gateway_body), scale.paired_calls
                    )
                    rounds.append(
                        (direct.p(50), through.p(50), proxied.p(50), added.p(50), floor.p(50))
                    )
            columns = list(zip(*rounds, strict=True))
            facts[f"added-{mode}-{name}"] = columns[3]
            facts[f"proxy-{mode}-{name}"] = columns[4]
            lines.append(
                f"| {mode} | {name} | {spread(columns[0])} ms | {spread(columns[1])} ms "
                f"| {spread(columns[2])} ms | {spread(columns[3], '{:+.2f}')} ms "
                f"| {spread(columns[4], '{:+.2f}')} ms |"
            )
    return lines, facts


def concurrency_32(up: str, gw: Gateway, jpeg: bytes, scale: Scale) -> tuple[list[str], Facts]:
    """Direct vs gateway at concurrency 32, and the CPU each request costs the gateway and the
    do-nothing proxy (process CPU seconds / requests that reached the upstream)."""
    lines = [
        "| mode | direct p50 / p99 | gateway p50 / p99 | requests/s direct / gateway | errors |",
        "|---|---|---|---|---|",
    ]
    facts: Facts = {}
    for mode, (model, _) in MODES.items():
        direct_body, gateway_body = predict_body(jpeg, mode), detect_body(jpeg, model)
        failed_before = gw.failed_requests()
        d = load.closed_loop(up, PREDICT, direct_body, 32, scale.load_seconds)
        g = load.closed_loop(gw.target, load.DETECT, gateway_body, 32, scale.load_seconds)
        errors = d.errors + g.errors + gw.failed_requests() - failed_before
        lines.append(
            f"| {mode} | {d.p(50):.2f} / {d.p(99):.2f} ms | {g.p(50):.2f} / {g.p(99):.2f} ms "
            f"| {d.rate:.0f} / {g.rate:.0f} | {errors} |"
        )
    cpu_lines = [
        "| run | gateway: µs CPU per request (requests/s) | do-nothing proxy: µs CPU per "
        "request (requests/s) | typed do-nothing proxy: µs CPU per request (requests/s) "
        "| gateway / proxy | typed proxy / proxy | gateway's own µs per request (gateway - "
        "proxy) |",
        "|---|---|---|---|---|---|---|",
    ]
    model = MODES["string"][0]
    direct_body, gateway_body = predict_body(jpeg, "string"), detect_body(jpeg, model)
    ratios, typed_ratios, own = [], [], []
    # Each run alternates the three in short slices and sums CPU and calls per process, so a
    # change in the machine's load (other tenants) weighs on all three alike. Each run starts
    # its own three processes: gateway processes started alike differ by up to 4.5 % in CPU
    # per request over the same slices (four side by side: 907 to 948 µs), so runs on one set
    # of processes would repeat one draw of that spread.
    slices = scale.cpu_slices
    seconds = scale.load_seconds / slices
    for run in range(scale.rounds):
        with (
            gateway(up) as run_gw,
            proxy(up, send=direct_body) as px,
            proxy(up, send=direct_body, typed=True) as typed,
        ):
            warm = ((run_gw.target, load.DETECT), (px.target, PREDICT), (typed.target, load.DETECT))
            for target, method in warm:
                load.closed_loop(target, method, gateway_body, 32, scale.load_seconds / 8)
            totals = {who: [0.0, 0, 0.0] for who in ("gateway", "proxy", "typed")}
            for _ in range(slices):
                for who, target, method, pids in (
                    ("gateway", run_gw.target, load.DETECT, run_gw.pids()),
                    ("proxy", px.target, PREDICT, [px.process.pid]),
                    ("typed", typed.target, load.DETECT, [typed.process.pid]),
                ):
                    cpu_before, (calls_before, _) = cpu_seconds(pids), bench_upstream.stats(up)
                    result = load.closed_loop(target, method, gateway_body, 32, seconds, warmup=0.5)
                    total = totals[who]
                    total[0] += cpu_seconds(pids) - cpu_before
                    total[1] += bench_upstream.stats(up)[0] - calls_before
                    total[2] += result.rate / slices
            per = {who: (cpu / calls * 1e6, rate) for who, (cpu, calls, rate) in totals.items()}
            ratios.append(per["gateway"][0] / per["proxy"][0])
            typed_ratios.append(per["typed"][0] / per["proxy"][0])
            own.append(per["gateway"][0] - per["proxy"][0])
            cpu_lines.append(
                f"| {run + 1} | {per['gateway'][0]:.0f} ({per['gateway'][1]:.0f}) "
                f"| {per['proxy'][0]:.0f} ({per['proxy'][1]:.0f}) "
                f"| {per['typed'][0]:.0f} ({per['typed'][1]:.0f}) "
                f"| {ratios[-1]:.2f}x | {typed_ratios[-1]:.2f}x | {own[-1]:.0f} |"
            )
    facts["cpu-ratio"] = ratios
    facts["cpu-ratio-typed"] = typed_ratios
    facts["cpu-own"] = own
    return [*lines, "", *cpu_lines], facts
