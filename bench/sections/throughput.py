"""Section 3: throughput at concurrency 32 with 1 and 2 gateway worker processes, and how far
two workers can scale on the cores the rest of the machine leaves them."""

from __future__ import annotations

import time

from bench import load
from bench.calls import MODES, detect_body
from bench.host import cpu_seconds, machine_busy, rss_mib
from bench.processes import gateway
from bench.sections import Facts, Scale


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
        body = detect_body(jpeg, model)
        rates: dict[int, list[float]] = {1: [], 2: []}
        cores: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
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
            cores[workers].append((gateway_cores, other_cores))
            facts[f"rss-load-{mode}-{workers}"] = max(
                facts.get(f"rss-load-{mode}-{workers}", 0.0), *peak.values()
            )
            lines.append(
                f"| {mode} | {workers} | {result.rate:.0f} | {result.p(50):.1f} / "
                f"{result.p(99):.1f} ms | {errors} | {gateway_cores:.2f} / "
                f"{other_cores:.2f} | {max(peak.values()):.0f} MiB |"
            )
        facts[f"rates-{mode}"] = rates
        facts[f"cores-{mode}"] = cores
    return lines, facts


def workers_estimate(facts: Facts, mode: str) -> tuple[float, float]:
    """A model, not a measurement: two workers can use at most the cores the rest of the
    machine left them, so their speed-up is at most (2 - others) / (cores of one worker).
    Computed for every pair of a one-worker and a two-worker run; (lowest, highest)."""
    one = [g for g, _ in facts[f"cores-{mode}"][1]]
    others = [o for _, o in facts[f"cores-{mode}"][2]]
    bounds = [(2 - o) / g for g in one for o in others if g > 0]
    if not bounds:  # a --quick run on a busy machine may measure no CPU time at all
        return float("nan"), float("nan")
    return min(bounds), max(bounds)
