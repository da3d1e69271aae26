"""Sections 4 and 5: start to SERVING, idle RSS and bytes per image at the upstream; then
`max_side` on a big photo, and the gateway end to end against the client recipe calling the
upstream directly."""

from __future__ import annotations

import statistics
import time

from bench import load, recipe
from bench.calls import MODES, detect_body, send, sent_upstream
from bench.host import rss_mib
from bench.processes import gateway
from bench.sections import Facts, Scale


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
    with gateway(up) as gw:
        for name, data in jpegs.items():
            for mode, (model, _) in MODES.items():
                sent = sent_upstream(up, gw.target, detect_body(data, model))
                facts[f"sent-{mode}-{name}"] = sent / len(data)
                lines.append(
                    f"| bytes per image that reached the upstream, {mode} mode, {name} "
                    f"({len(data):,} B) | {sent:,.0f} B ({sent / len(data):.3f}x the JPEG) |"
                )
    return lines, facts


# The gateway's model config for section 5: both bench models scaled to at most 1024 px.
MAX_SIDE = 1024


MAX_SIDE_CONFIG = f"""
[models.pixels]
task = "detection"
[models.pixels.input]
max_side = {MAX_SIDE}

[models.encoded]
task = "detection"
[models.encoded.input]
max_side = {MAX_SIDE}
"""


def max_side(up: str, name: str, data: bytes, scale: Scale) -> tuple[list[str], Facts]:
    """Section 5: a big photo with and without `max_side` (bytes counted at the upstream), and
    the gateway end to end against the client recipe calling the upstream directly."""
    facts: Facts = {}
    lines = [
        "| gateway model config | mode | bytes per image at the upstream | vs the JPEG "
        "| gateway latency, concurrency 1 (median of 9) |",
        "|---|---|---|---|---|",
    ]
    for label, config in (("none", None), (f"max_side = {MAX_SIDE}", MAX_SIDE_CONFIG)):
        with gateway(up, model_config=config) as gw:
            for mode, (model, _) in MODES.items():
                body = detect_body(data, model)
                sent = sent_upstream(up, gw.target, body)
                ms = statistics.median(send(gw.target, load.DETECT, body, 9))
                facts[f"sent-{mode}-{label}"] = sent
                lines.append(
                    f"| {label} | {mode} | {sent:,.0f} B | {sent / len(data):.3f}x | {ms:.1f} ms |"
                )
    lines += [
        "",
        "End to end at concurrency 1, one caller alternating the two call by call, each run a "
        "new process (`python -m bench.recipe e2e`): the recipe builds the 36.6 MB "
        "PredictRequest from the JPEG and calls the upstream directly; the gateway "
        f"(`max_side = {MAX_SIDE}`, pixel mode) is sent the JPEG.",
        "",
        "| allocator of the calling process | run | recipe + direct call (median) "
        "| gateway (median) | gateway / recipe |",
        "|---|---|---|---|---|",
    ]
    with gateway(up, model_config=MAX_SIDE_CONFIG) as gw:
        for state in recipe.STATES:
            ratios = []
            for run in range(scale.rounds):
                result = recipe.in_state(
                    state, "e2e", f"--upstream={up}", f"--gateway={gw.target}",
                    f"--image={name}", f"--calls={scale.e2e_calls}",
                )  # fmt: skip
                r, g = result["recipe"]["median"], result["gateway"]["median"]
                ratios.append(g / r)
                lines.append(f"| {state} | {run + 1} | {r:.1f} ms | {g:.1f} ms | {g / r:.3f}x |")
            facts[f"e2e-{state}"] = ratios
    return lines, facts
