"""This code's hot path against an earlier revision's, in one sitting -> the "hotpath" section
of bench/results.md.

`python -m bench.ownwork` (the gateway's own Python per string-mode Detect: servicer ->
pipeline -> result bytes, TF Serving replaced by a coroutine) runs in this checkout and in a
git worktree of REV made for the run, alternately, ROUNDS times each, each run a new process
that measures with the code of its own tree. Alternating in one sitting makes the ratio the
figure, not either side's absolute time (a shared machine moves both alike).

    python -m bench.hotpath --against REV [--rounds 4] [--requests 20000]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.host import load_average, machine
from bench.results import RESULTS, spread, verdict, write_section

ROOT = Path(__file__).resolve().parents[1]
_FIGURE = re.compile(r"([0-9.]+) µs")


def own_work(tree: Path, requests: int) -> float:
    """µs per request, as `python -m bench.ownwork` in `tree` measures it with its own code."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    run = subprocess.run(
        [sys.executable, "-m", "bench.ownwork", f"--requests={requests}"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    found = _FIGURE.findall(run.stdout)
    if run.returncode != 0 or not found:
        raise SystemExit(
            f"bench.ownwork failed in {tree}:\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
        )
    return float(found[-1])


def revision(rev: str) -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    old_rev, new_rev = revision(args.against), revision("HEAD")
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    figures: dict[str, list[float]] = {"this code": [], args.against: []}
    with tempfile.TemporaryDirectory(prefix="hotpath-") as tmp:
        old_tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(old_tree), old_rev],
            cwd=ROOT,
            check=True,
        )
        try:
            for round_ in range(args.rounds):
                sides = [("this code", ROOT), (args.against, old_tree)]
                for side, tree in sides if round_ % 2 == 0 else sides[::-1]:
                    figures[side].append(own_work(tree, args.requests))
                    print(f"{side}: {figures[side][-1]:.1f} µs", flush=True)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(old_tree)], cwd=ROOT, check=False
            )
    new, old = figures["this code"], figures[args.against]
    top = max(old)
    command = f"python -m bench.hotpath --against {args.against} --rounds {args.rounds}"
    text = "\n".join(
        [
            "## The hot path against an earlier revision (`python -m bench.hotpath`)",
            "",
            f"`{command}` on {began}: {machine()}. Load average before {load_before}, after "
            f"{load_average()} (a shared machine). `python -m bench.ownwork "
            f"--requests {args.requests}` (the gateway's own Python per string-mode Detect, "
            f"best of 5 batches) run with the code of {new_rev} and of {old_rev}, alternately, "
            f"{args.rounds} times each, each run a new process.",
            "",
            "| code | µs per Detect |",
            "|---|---|",
            f"| this code ({new_rev}) | {spread(new, '{:.1f}')} |",
            f"| {args.against} ({old_rev}) | {spread(old, '{:.1f}')} |",
            "",
            "| target | verdict |",
            "|---|---|",
            f"| median within the earlier code's spread (<= {top:.1f} µs) | "
            f"{'met' if statistics.median(new) <= top else '**not met**'} |",
            f"| each run within the earlier code's spread | {verdict(new, lambda v: v <= top)} |",
        ]
    )
    write_section(args.out, "hotpath", text)
    print(text)


if __name__ == "__main__":
    main()
