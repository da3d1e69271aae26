"""`python -m bench.pipelines --quick` runs end to end: the scene has its 8 boxes, the pipeline
and the caller's two ways answer at both concurrencies without an error, the batched classifier
takes fewer Predict calls than crops, and the section is written with a verdict for every
target. A smoke test: never how fast anything is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.pipelines import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_quick_pipelines_bench_writes_its_section(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    out.write_text("# Benchmark results\n\nearlier sections\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.pipelines", "--quick", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,  # inside the test's own limit, so a hang fails here with output
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    assert report.startswith("# Benchmark results\n\nearlier sections\n")
    assert report.count("<!-- begin pipelines -->") == report.count("<!-- end pipelines -->") == 1
    rows = [line.split("|") for line in report.splitlines() if re.match(r"\| c\d+ \| ", line)]
    assert [(row[1].strip(), row[2].strip()) for row in rows] == [
        (c, way) for c in ("c1", "c8") for way in ("pipeline", "caller, in turn", "caller, at once")
    ]
    for row in rows:
        assert float(row[3]) > 0 and float(row[6]) > 0, row  # images/s, gateway CPU
        assert row[11].strip() == "0", row  # errors
    calls = {(row[1].strip(), row[2].strip()): float(row[10]) for row in rows}
    assert calls[("c1", "caller, in turn")] == 1.0  # one Classify, one Predict
    assert calls[("c8", "pipeline")] < 1.0  # the crops shared Predicts
    targets = report.split("### Targets")[1]
    verdicts = re.findall(r"\| (met|\*\*not met\*\*|\*\*borderline\*\*.*) \|$", targets, re.M)
    assert len(verdicts) == 5


@pytest.mark.parametrize("argv", [["--seconds=0"], ["--rounds=0"], ["--nonsense"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
