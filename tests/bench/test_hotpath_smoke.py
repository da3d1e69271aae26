"""`python -m bench.hotpath --against HEAD` runs end to end: bench.ownwork measured in this
checkout and in a worktree of the revision, alternately, and its section written with a
verdict. A smoke test: never how fast anything is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_hotpath_bench_compares_two_trees_and_writes_its_section(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    out.write_text("# Benchmark results\n\nearlier sections\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.hotpath", "--against=HEAD", "--rounds=1",
         "--requests=200", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    assert report.startswith("# Benchmark results\n\nearlier sections\n")
    assert report.count("<!-- begin hotpath -->") == report.count("<!-- end hotpath -->") == 1
    rows = [line.split("|") for line in report.splitlines() if line.startswith("| this code")]
    rows += [line.split("|") for line in report.splitlines() if line.startswith("| HEAD")]
    assert len(rows) == 2 and all(float(row[2]) > 0 for row in rows), rows
    assert "| median within the earlier code's spread" in report
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True)
    assert "hotpath-" not in listed.stdout  # the worktree made for the run is gone
