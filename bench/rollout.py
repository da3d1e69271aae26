"""`python -m bench.rollout`: does a shadow cost the caller (issue 35.2)?

Two gateways side by side in front of the canned upstream (each Predict answered after
`--delay-ms`, without CPU), measured in turn: one serving the `encoded` detector plainly, one
with `[models.encoded.rollout] shadow = { version = 1, share = S }` (`--share`, default 0.2 as
in the issue's example), so that share of the answered requests is copied to the candidate in
the background (here the same version: the copy costs what a real candidate's call would, and
the comparison runs on each). Callers send Detect with
the 640x480 JPEG, closed loop with h2load at concurrency 16, `--rounds` rounds of `--seconds`
each after a warm-up, alternating which gateway goes first. Target: the caller's p50 and p99
with the shadow within the spread of those without (at most the highest run without). The
shadow's copies sent and dropped come from the gateway's metrics.
-> the "rollout" section of bench/results.md.

    python -m bench.rollout [--seconds 5] [--rounds 3] [--delay-ms 5] [--share 0.2] [--quick]
"""

from __future__ import annotations

import argparse
import re
import time
import urllib.request
from pathlib import Path

from bench import load
from bench.calls import detect_body
from bench.host import load_average, machine
from bench.processes import Gateway, gateway
from bench.processes import upstream as canned_upstream
from bench.results import RESULTS, spread, verdict, write_section

PHOTO = Path(__file__).resolve().parent / "images" / "photo_640x480.jpg"
MODEL = "encoded"
CONCURRENCY = 16
PLAIN = f'[models.{MODEL}]\ntask = "detection"\n'
SIDES = ("without", "with shadow")


def shadow_calls(gw: Gateway) -> dict[str, float]:
    url = f"http://127.0.0.1:{gw.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.findall(r'^vision_gateway_shadow_calls_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)$',
                       text, re.M)  # fmt: skip
    return {outcome: float(n) for outcome, n in found}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per run, after 1 s warm-up")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each gateway")
    parser.add_argument("--delay-ms", type=float, default=5.0, help="the upstream's time")
    parser.add_argument("--share", type=float, default=0.2, help="the shadow's share")
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 round (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    body = detect_body(PHOTO.read_bytes(), MODEL)
    shadow = f"[models.{MODEL}.rollout]\nshadow = {{ version = 1, share = {args.share:g} }}\n"
    p50: dict[str, list[float]] = {side: [] for side in SIDES}
    p99: dict[str, list[float]] = {side: [] for side in SIDES}
    rate: dict[str, list[float]] = {side: [] for side in SIDES}
    errors = 0
    with (
        canned_upstream(args.delay_ms) as up,
        gateway(up, model_config=PLAIN) as plain,
        gateway(up, model_config=PLAIN + shadow) as shadowed,
    ):
        gateways = {"without": plain, "with shadow": shadowed}
        for gw in gateways.values():  # signature fetch, warm caches
            load.closed_loop(gw.target, load.DETECT, body, 4, 1.0, warmup=0.5)
        before = shadow_calls(shadowed)
        for round_ in range(args.rounds):
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                gw = gateways[side]
                run = load.closed_loop(gw.target, load.DETECT, body, CONCURRENCY, args.seconds)
                p50[side].append(run.p(50))
                p99[side].append(run.p(99))
                rate[side].append(run.rate)
                errors += run.errors + gw.failed_requests()
                print(f"{side}: p50 {run.p(50):.2f} p99 {run.p(99):.2f} ms", flush=True)
        after = shadow_calls(shadowed)
    sent = after.get("sent", 0) - before.get("sent", 0)
    dropped = after.get("dropped", 0) - before.get("dropped", 0)
    failed = after.get("failed", 0) - before.get("failed", 0)
    command = (
        f"python -m bench.rollout --seconds {args.seconds:g} --rounds {args.rounds} "
        f"--delay-ms {args.delay_ms:g} --share {args.share:g}"
    )
    top50, top99 = max(p50["without"]), max(p99["without"])
    text = "\n".join(
        [
            "## A shadow's cost to the caller (`python -m bench.rollout`)",
            "",
            f"`{command}` on {began}: {machine()}; generator {load.generator()}. Load average "
            f"before {load_before}, after {load_average()} (a shared machine). Detect with the "
            f"640x480 JPEG at concurrency {CONCURRENCY} against the canned upstream "
            f"({args.delay_ms:g} ms per Predict, model `{MODEL}`, string mode); two gateways "
            f"side by side, one with `shadow = {{ version = 1, share = {args.share:g} }}`, "
            f"measured in turn ({args.rounds} rounds of {args.seconds:g} s, alternating which "
            "goes first).",
            "",
            "| gateway | requests/s | p50 ms | p99 ms |",
            "|---|---|---|---|",
            *(
                f"| {side} | {spread(rate[side], '{:.0f}')} | {spread(p50[side])} | "
                f"{spread(p99[side])} |"
                for side in SIDES
            ),
            "",
            f"Shadow copies over the runs: {sent:.0f} sent, {dropped:.0f} dropped (the gateway "
            f"near its concurrency limit, or 8 pending), {failed:.0f} failed; caller errors "
            f"{errors}.",
            "",
            "| target | verdict |",
            "|---|---|",
            f"| p50 with the shadow within the spread without (<= {top50:.2f} ms) | "
            f"{verdict(p50['with shadow'], lambda v: v <= top50)} |",
            f"| p99 with the shadow within the spread without (<= {top99:.2f} ms) | "
            f"{verdict(p99['with shadow'], lambda v: v <= top99)} |",
        ]
    )
    write_section(args.out, "rollout", text)
    print(text)


if __name__ == "__main__":
    main()
