"""`python -m bench.http --quick` runs end to end: both doors answer, its section is written
and replaces its earlier one, other sections stay. A smoke test: never how fast anything is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1300)  # two runs, each with its own 600 s limit
def test_quick_http_bench_writes_its_section(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    out.write_text("# Benchmark results\n\nearlier sections\n")
    for attempt in range(2):  # the second run replaces the first run's section
        if attempt:  # a section another benchmark added after ours stays
            out.write_text(out.read_text() + "\n## Batch runner\n\nits table\n")
        run = subprocess.run(
            [sys.executable, "-m", "bench.http", "--quick", f"--out={out}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,  # inside the test's own limit, so a hang fails here with output
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    assert report.startswith("# Benchmark results\n\nearlier sections\n")
    assert report.count("## HTTP door against the gRPC door") == 1
    assert report.count("<!-- begin http -->") == report.count("<!-- end http -->") == 1
    assert "## Batch runner\n\nits table\n" in report
    targets = report.split("| target | measured | |")[1].split("###")[0]
    assert len(re.findall(r"\| (met|\*\*not met\*\*) \|$", targets, re.MULTILINE)) == 4
    # Every load run completed requests without errors.
    rows = [
        line.split("|")
        for line in report.splitlines()
        if line.startswith(("| gRPC |", "| HTTP raw"))
    ]
    assert len(rows) == 4
    assert all(float(row[2]) > 0 and row[4].strip() == "0" for row in rows)
