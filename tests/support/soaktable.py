"""Renders the soak table of docs/operations.md (Markdown) from a soak report (`make soak` writes
bench/soak-report.json): `python -m tests.support.soaktable [REPORT]`.

Every figure in the table is read or computed from the report: ranges are min-max of the
measured lists, a peak is the largest sample.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_REPORT = Path(__file__).resolve().parents[2] / "bench" / "soak-report.json"


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def _range(values: list[float], unit: str = "s") -> str:
    low, high = min(values), max(values)
    return f"{low:.2f} {unit}" if low == high else f"{low:.2f}–{high:.2f} {unit}"


def _limit(values: list[float], limit: float) -> str:
    over = sum(v > limit for v in values)
    return (
        f"limit {limit:g} s"
        if not over
        else f"over the {limit:g} s limit in {over} of {len(values)}"
    )


def _codes(by_code: Mapping[str, int]) -> str:
    return ", ".join(f"{count:,} {code}" for code, count in sorted(by_code.items()))


def rows(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if (k := report.get("tf_serving_killed_and_restarted")) is not None:
        out.append(
            (
                f"TF Serving SIGKILLed under load (4 clients) and restarted, {k['cycles']} times",
                f"{k['requests']:,} requests: {_codes(k['by_code'])}; slowest failure "
                f"{k['slowest_failure_seconds']} s "
                f"(deadline {k.get('deadline_seconds', 10):g} s); outages "
                f"{_range(k['outage_seconds'])} (model loading); serving again "
                f"{_range(k['recovery_seconds'])} after TF Serving's port opened "
                f"({_limit(k['recovery_seconds'], 5.0)}), no restart; gateway RSS "
                f"{_mib(k['gateway_rss_kib']['VmRSS'])} after",
            )
        )
    if (s := report.get("slow_tf_serving")) is not None:
        out.append(
            (
                f"TF Serving delayed 60 s, {s['calls']} calls with a "
                f"{s['client_deadline_seconds']:g} s deadline",
                f"{s['calls']} DEADLINE_EXCEEDED, {s['upstream_cancelled']} TF Serving calls "
                f"cancelled, 0 left in flight; gateway RSS "
                f"{s['gateway_rss_kib_before'] / 1024:.1f} → "
                f"{s['gateway_rss_kib_after'] / 1024:.1f} MiB",
            )
        )
    if (b := report.get("retry_budget_outage")) is not None:
        without = b.get("upstream_attempts_without_budget")
        measured = f"{without:,} measured" if without is not None else "not measured"
        out.append(
            (
                f"Outage answered by the fault upstream, {b['calls']} calls",
                f"{b['upstream_attempts']:,} TF Serving attempts with the retry budget; "
                f"without it: {measured} (3 attempts per call)",
            )
        )
    if (t := report.get("sigterm_32_in_flight")) is not None:
        out.append(
            (
                "SIGTERM with 32 requests held in TF Serving",
                f"{t['completed']} of 32 completed, health NOT_SERVING and new request "
                f"UNAVAILABLE during the drain, exit 0 after {t['exit_seconds']} s",
            )
        )
    if (r := report.get("health_checks_at_sigterm")) is not None:
        out.append(
            (
                f"{r['gateways']:,} gateways, health checks raced at SIGTERM and at the end "
                "of the drain",
                f"{sum(r['answers'].values()):,} checks: {_codes(r['answers'])}; none left "
                "waiting for its deadline"
                + "".join(f"; {n} x {d!r}" for d, n in sorted(r.get("other_errors", {}).items())),
            )
        )
    if (h := report.get("hostile_images_via_grpc")) is not None:
        samples = h["gateway_rss_kib_samples"]
        step = h["rss_sample_every_images"]
        out.append(
            (
                f"{h['images']:,} hostile images through one gateway (corpus, then "
                f"{h['random_images']:,} with random damage)",
                f"{_codes(h['by_code'])}; RSS {_mib(samples[0])} after the corpus, "
                f"{_mib(min(samples[1:]))}–{_mib(max(samples[1:]))} over the "
                f"{len(samples) - 1} samples (one per {step:,} images), peak "
                f"{_mib(max(samples))}, {_mib(samples[-1])} at the end "
                f"(growth {_mib(max(samples) - samples[0])})",
            )
        )
    if (f := report.get("fuzz")) is not None:
        out.append(
            (
                "Fuzzing (`hypothesis`)",
                f"{f['examples']:,} examples: " + _codes(f["outcomes"]),
            )
        )
    return out


def render(report: Mapping[str, Any]) -> str:
    run = report.get("run", {})
    machine = run.get("machine", {})
    header = (
        f"One run ({run.get('date', '?')}, commit {str(run.get('git_commit', '?'))[:7]}"
        f"{' + local changes' if run.get('git_dirty') else ''}; {machine.get('nproc', '?')} "
        f"cores, {machine.get('memory_mib', 0) / 1024:.0f} GiB; load average "
        f"{machine.get('load_average', ['?'])[0]} at the start, "
        f"{run.get('load_average_at_end', ['?'])[0]} at the end):"
    )
    lines = [header, "", "| Test | Figures |", "|---|---|"]
    lines += [f"| {test} | {figures} |" for test, figures in rows(report)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_REPORT
    sys.stdout.write(render(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
