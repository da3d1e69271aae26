"""`python -m bench.cost --quick` runs end to end: the worst-case segmentation is priced, the
heavy caller is answered and refused at its quota, the steady caller's runs, /ping and the RSS
are measured, and its section is written with a verdict for each target. A smoke test: never
how fast anything is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_quick_cost_bench_writes_its_section(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    out.write_text("# Benchmark results\n\nearlier sections\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.cost", "--quick", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,  # inside the test's own limit, so a hang fails here with output
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    assert report.startswith("# Benchmark results\n\nearlier sections\n")
    assert report.count("<!-- begin cost -->") == report.count("<!-- end cost -->") == 1
    price = re.search(r"\| gateway CPU per request: [^|]*, default limits \| ([\d.]+) s \(", report)
    assert price and float(price.group(1)) > 0, report
    heavy = re.search(r"other errors \| (\d+), (\d+), (\d+) \|", report)
    assert heavy, report
    answered, _, errors = (int(n) for n in heavy.groups())
    assert answered > 0 and errors == 0
    assert re.search(r"\| steady errors \(any\) \| 0 \|", report), report
    verdicts = re.findall(r"(met|\*\*not met\*\*|\*\*borderline\*\*[^)]*)\) \|$", report, re.M)
    assert len(verdicts) == 3, report
