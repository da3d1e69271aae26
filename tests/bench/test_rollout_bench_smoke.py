"""`python -m bench.rollout --quick` runs end to end: both gateways answer, the shadow's
copies are sent, and its section is written with a verdict for both targets. A smoke test:
never how fast anything is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_quick_rollout_bench_writes_its_section(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    out.write_text("# Benchmark results\n\nearlier sections\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.rollout", "--quick", "--share=1", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,  # inside the test's own limit, so a hang fails here with output
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    assert report.startswith("# Benchmark results\n\nearlier sections\n")
    assert report.count("<!-- begin rollout -->") == report.count("<!-- end rollout -->") == 1
    rows = [line.split("|") for line in report.splitlines() if line.startswith("| with")]
    assert len(rows) == 2 and all(float(row[2]) > 0 for row in rows), rows
    copies = re.search(
        r"Shadow copies over the runs: (\d+) sent, (\d+) dropped \([^)]*\), (\d+) failed; "
        r"caller errors (\d+)",
        report,
    )
    assert copies, report
    sent, _, failed, errors = (int(n) for n in copies.groups())
    assert sent > 0 and failed == 0 and errors == 0
    verdicts = re.findall(r"\| (met|\*\*not met\*\*|\*\*borderline\*\*.*) \|$", report, re.M)
    assert len(verdicts) == 2
