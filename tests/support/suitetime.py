"""What the suite takes, measured: `make test` on a fresh clone step by step, or `make test-fast`
in this checkout, with each test's seconds from pytest's JUnit XML. Writes the `suite` (or
`suite-fast`) section of bench/results.md, which docs/testing.md quotes.

    python -m tests.support.suitetime            # fresh clone of HEAD in a temporary directory
    python -m tests.support.suitetime --fast     # `make test-fast` here, from the built venv
    python -m tests.support.suitetime --junit FILE --print   # the tables of a run made elsewhere

The fresh clone runs the targets `make test` runs, one after another in make's order, so their
sum is `make test` (the per-machine caches under ~/.cache/tfs-detection-gateway are used as a
CI run on this machine would use them; the section says which steps found theirs). The load
is sampled every few seconds: on a shared machine the other work's share of the cores is part
of the figure, so the section states it next to the times.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench import host
from bench import results as bench_results

ROOT = Path(__file__).resolve().parents[2]
SLOWEST = 15
# `make test`'s prerequisites in the order make runs them, each alone so it is timed alone:
# test -> lint typecheck k8s-check pytest; pytest -> venv, npm tools, chromium, zoo-venv,
# peers, the reference models, the zoo, then pytest itself.
FRESH_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("venv", ("make", "venv")),
    ("npm tools (buf, k8s validators)", ("make", ".tools/node_modules/.bin/buf", "k8s-node")),
    ("lint (ruff, buf)", ("make", "lint")),
    ("typecheck (mypy)", ("make", "typecheck")),
    ("k8s-check", ("make", "k8s-check")),
    ("chromium, curl", ("make", "http-test-tools")),
    ("zoo-venv", ("make", "zoo-venv")),
    ("peers' venvs", ("make", "peers")),
    ("reference models", ("make", "test-models")),
    ("zoo", ("make", "zoo")),
)


@dataclass
class Case:
    file: str  # tests/e2e/test_lifecycle.py
    name: str
    seconds: float  # setup + call + teardown
    outcome: str  # passed, failed, error, skipped


@dataclass
class Step:
    name: str
    seconds: float
    ok: bool


@dataclass
class Load:
    """The 1-minute load average sampled while the run goes, and the CPU time of the machine
    and of the run's own processes."""

    samples: list[float] = field(default_factory=list)
    busy_start: float = field(default_factory=host.machine_busy)
    own_start: float = field(default_factory=lambda: _children_cpu())
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)

    def sample(self, every: float = 5.0) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self.done.wait(every):
                return

    def summary(self) -> str:
        wall = time.monotonic() - self.started
        busy = host.machine_busy() - self.busy_start
        own = _children_cpu() - self.own_start
        others = max(0.0, busy - own) / wall if wall else 0.0
        mean = sum(self.samples) / len(self.samples) if self.samples else os.getloadavg()[0]
        peak = max(self.samples, default=mean)
        return (
            f"Load average (1 min) {mean:.1f} on average, {peak:.1f} at most; the run's own "
            f"processes used {own:,.0f} CPU-s, other work on the machine {others:.1f} of its "
            f"{os.cpu_count()} cores on average."
        )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _file_of(classname: str, root: Path) -> str:
    """tests.e2e.test_lifecycle.TestY -> tests/e2e/test_lifecycle.py (the longest dotted prefix
    that is a file)."""
    parts = [part for part in classname.split(".") if part]
    for end in range(len(parts), 0, -1):
        candidate = Path(*parts[:end]).with_suffix(".py")
        if (root / candidate).is_file():
            return candidate.as_posix()
    return Path(*parts).as_posix() if parts else "(collection)"


def read_junit(path: Path, root: Path = ROOT) -> list[Case]:
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("file") or _file_of(case.get("classname", ""), root)
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        cases.append(Case(file, case.get("name", ""), float(case.get("time", 0)), outcome))
    return cases


def _minutes(seconds: float) -> str:
    return f"{seconds:,.0f} s ({seconds / 60:.1f} min)"


def _directory(file: str) -> str:
    return Path(file).parent.as_posix()


def tables(cases: Sequence[Case], slowest: int = SLOWEST) -> str:
    """Per directory (seconds, share) and the slowest tests."""
    total = sum(c.seconds for c in cases)
    counts: dict[str, int] = defaultdict(int)
    for c in cases:
        counts[c.outcome] += 1
    by_dir: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        by_dir[_directory(c.file)].append(c)
    outcome = ", ".join(f"{counts[k]:,} {k}" for k in ("passed", "failed", "error", "skipped"))
    lines = [
        f"{len(cases):,} tests ({outcome}); their setup, call and teardown add up to "
        f"{_minutes(total)}.",
        "",
        "| directory | tests | s | share |",
        "|---|---|---|---|",
    ]
    for name, group in sorted(by_dir.items(), key=lambda kv: -sum(c.seconds for c in kv[1])):
        seconds = sum(c.seconds for c in group)
        share = 100 * seconds / total if total else 0.0
        lines.append(f"| `{name}` | {len(group)} | {seconds:,.1f} | {share:.1f}% |")
    lines += ["", f"The {slowest} slowest tests:", "", "| test | s |", "|---|---|"]
    for c in sorted(cases, key=lambda c: -c.seconds)[:slowest]:
        lines.append(f"| `{c.file}::{c.name}` | {c.seconds:.1f} |")
    return "\n".join(lines)


def _run(name: str, argv: Sequence[str], cwd: Path, env: dict[str, str], log: Path) -> Step:
    started = time.monotonic()
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    code = done.returncode
    step = Step(name, time.monotonic() - started, code == 0)
    print(f"{name}: {step.seconds:.1f} s{'' if step.ok else f' (exit {code})'}", flush=True)
    return step


def envtest(root: Path = ROOT) -> Path | None:
    """envtest's binaries in ../shared beside the checkout `root`, or beside the main checkout
    when `root` is a worktree of it (as .ci/run finds them beside its clone)."""
    argv = ["git", "-C", str(root), "rev-parse", "--path-format=absolute", "--git-common-dir"]
    common = subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    for checkout in (root, *([Path(common).parent] if common else [])):
        envtest = checkout.parent / "shared" / "envtest" / "bin"
        if envtest.is_dir():
            return envtest
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CI", "1")  # as .ci/run: a missing tool fails instead of skipping
    assets = envtest()
    if "KUBEBUILDER_ASSETS" not in env and assets is not None:
        env["KUBEBUILDER_ASSETS"] = str(assets)
    env.pop("PYTHONPATH", None)  # the clone's own code, not this checkout's
    return env


def _commit(where: Path) -> str:
    argv = ["git", "-C", str(where), "log", "-1", "--format=%h (%cs)"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _step_table(steps: Iterable[Step]) -> list[str]:
    steps = list(steps)
    rows = ["| step | s |", "|---|---|"]
    rows += [f"| {s.name}{'' if s.ok else ' (**failed**)'} | {s.seconds:,.1f} |" for s in steps]
    rows.append(f"| **`make test`** | **{sum(s.seconds for s in steps):,.1f}** |")
    return rows


def fresh_clone(workdir: Path | None, keep: bool, with_pytest: bool = True) -> str:
    """`make test` on a fresh clone of HEAD, step by step; the section's text."""
    parent = Path(tempfile.mkdtemp(prefix="suitetime-", dir=workdir))
    clone, junit, log = parent / "clone", parent / "junit.xml", parent / "make.log"
    print(f"cloning into {clone}; the steps' output goes to {log}", flush=True)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env, load = _env(), Load()
    sampler = threading.Thread(target=load.sample, daemon=True)
    sampler.start()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    try:
        steps = []
        for name, argv in FRESH_STEPS:
            steps.append(_run(name, argv, clone, env, log))
            if name == "venv" and not steps[-1].ok:
                raise SystemExit(f"make venv failed: {log}")
        if with_pytest:
            pytest_args = f"PYTEST_ARGS=--junitxml={junit} -o junit_family=xunit1"
            steps.append(_run("pytest", ("make", "pytest", pytest_args), clone, env, log))
        load.done.set()
        cases = read_junit(junit, clone) if with_pytest else []
        text = [
            "## The suite's time (`python -m tests.support.suitetime`)",
            "",
            f"`make test` on a fresh clone of {_commit(clone)}, {when} UTC: {host.machine()}. "
            f"{load.summary()} Each of make test's targets alone, in make's order; the steps "
            "that take a second or two found their per-machine cache (~/.cache).",
            "",
            *_step_table(steps),
            "",
            "pytest: " + tables(cases) if with_pytest else "(pytest not run)",
        ]
        return "\n".join(text)
    finally:
        load.done.set()
        if keep:
            print(f"kept {parent}")
        else:
            shutil.rmtree(parent, ignore_errors=True)


def fast() -> str:
    """`make test-fast` in this checkout (a built venv); the section's text."""
    parent = Path(tempfile.mkdtemp(prefix="suitetime-fast-"))
    junit, log = parent / "junit.xml", parent / "make.log"
    load = Load()
    sampler = threading.Thread(target=load.sample, daemon=True)
    sampler.start()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    try:
        pytest_args = f"PYTEST_ARGS=--junitxml={junit} -o junit_family=xunit1"
        # -o: the built venv is taken as it is, never reinstalled (in a worktree whose .venv is
        # a link to another checkout's, a reinstall would point that venv at this checkout).
        argv = ("make", "-o", ".venv/.installed", "test-fast", pytest_args)
        step = _run("make test-fast", argv, ROOT, _env(), log)
        load.done.set()
        cases = read_junit(junit)
        text = [
            "## The quick loop's time (`python -m tests.support.suitetime --fast`)",
            "",
            f"`make test-fast` at {_commit(ROOT)}, {when} UTC, from a built venv: "
            f"{host.machine()}. {load.summary()}",
            "",
            f"`make test-fast`{'' if step.ok else ' (**failed**)'}: {_minutes(step.seconds)}.",
            "",
            "pytest: " + tables(cases),
        ]
        return "\n".join(text)
    finally:
        load.done.set()
        shutil.rmtree(parent, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="time `make test-fast` here")
    parser.add_argument("--junit", type=Path, help="only print the tables of this JUnit XML")
    parser.add_argument("--print", action="store_true", help="print, do not write results.md")
    parser.add_argument("--workdir", type=Path, help="where the fresh clone goes (a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its logs")
    parser.add_argument("--setup-only", action="store_true", help="all but pytest; print only")
    args = parser.parse_args(argv)
    if args.junit:
        print(tables(read_junit(args.junit)))
        return
    if args.setup_only:
        print(fresh_clone(args.workdir, args.keep, with_pytest=False))
        return
    name = "suite-fast" if args.fast else "suite"
    text = fast() if args.fast else fresh_clone(args.workdir, args.keep)
    if args.print:
        print(text)
    else:
        bench_results.write_section(bench_results.RESULTS, name, text)
        print(f"wrote the {name} section of {bench_results.RESULTS}")


if __name__ == "__main__":
    main(sys.argv[1:])
