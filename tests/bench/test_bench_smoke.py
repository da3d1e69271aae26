"""`python -m bench --quick` runs every section end to end on the smallest image.

A smoke test: it checks that the benchmark scripts work (processes start, requests succeed,
the report is written), never how fast anything is.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # the run's own limit is 600 s
def test_quick_bench_writes_every_section_and_target(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    others = "<!-- begin http -->\n## Another engineer's section\n<!-- end http -->\n"
    out.write_text(others)
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--generator=python", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # inside the test's own 900 s limit, so a hang fails here with output
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    for heading in (
        "## Targets",
        "## 1. Request building",
        "## 2. Gateway overhead",
        "## 3. Throughput",
        "## 4. Footprint",
        "## 5. `max_side`",
    ):
        assert heading in report
    targets = report.split("## Targets")[1].split("## 1.")[0]
    verdicts = re.findall(
        r"\| (met|\*\*not met\*\*|\*\*borderline\*\*)[^|]*\|$", targets, re.MULTILINE
    )
    assert len(verdicts) == 12
    # Every load run completed requests without errors (the columns hold counts, not speed).
    throughput = report.split("## 3.")[1].split("## 4.")[0]
    rows = [line.split("|") for line in throughput.splitlines() if line.startswith("| p")]
    rows += [line.split("|") for line in throughput.splitlines() if line.startswith("| s")]
    assert len(rows) == 8  # 1, 2, 2, 1 workers in each mode
    assert all(float(row[3]) > 0 and row[5].strip() == "0" for row in rows)
    # Counted where they arrive (the bench upstream's stats RPC).
    assert "string mode, JPEG 640x480 (54,328 B) | 54,460 B" in report
    # Only its own section is written: what others wrote in the file stays.
    assert report.startswith(others) and report.count("<!-- begin bench -->") == 1
