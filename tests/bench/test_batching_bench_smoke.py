"""`python -m bench.batching --quick` runs end to end: both upstreams, both gateways (batching
on and off), every concurrency; its section is written with a verdict for every target, and
the batched gateway sent fewer Predict calls than images at concurrency 64. A smoke test:
never how fast anything is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers import venvs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_quick_batching_bench_writes_its_section(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    out.write_text("# Benchmark results\n\nearlier sections\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.batching", "--quick", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=800,  # inside the test's own limit, so a hang fails here with output
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    assert report.startswith("# Benchmark results\n\nearlier sections\n")
    assert report.count("<!-- begin batching -->") == report.count("<!-- end batching -->") == 1
    rows = [line.split("|") for line in report.splitlines() if re.match(r"\| c\d+ \| o", line)]
    assert len(rows) == 12  # 2 upstreams x 3 concurrencies x on/off
    for row in rows:
        assert float(row[3].replace(",", "")) > 0, row  # images/s
        assert row[8].strip() == "0", row  # errors
    # Unbatched, every image is its own call; batched at c64, images share calls.
    calls = {(row[1].strip(), row[2].strip()): float(row[7]) for row in rows[:6]}
    assert calls[("c64", "off")] == 1.0
    assert calls[("c64", "on")] < 1.0
    # MLServer with adaptive batching beside them, where `make peers` built its venv.
    peer = (venvs.directory() / "mlserver" / venvs.COMPLETE).exists()
    mlserver = [line.split("|") for line in report.splitlines() if "| MLServer |" in line]
    assert len(mlserver) == (2 if peer else 0)
    for row in mlserver:
        assert float(row[3].replace(",", "")) > 0 and row[8].strip() == "0", row
    targets = report.split("### Targets")[1]
    verdicts = re.findall(r"\| (met|\*\*not met\*\*|\*\*borderline\*\*.*) \|$", targets, re.M)
    assert len(verdicts) == (6 if peer else 5)
