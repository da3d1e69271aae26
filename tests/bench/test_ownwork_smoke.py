"""`python -m bench.ownwork` runs the servicer and pipeline in process and prints a figure.

A smoke test: the script works (the servicer answers through the fake upstream), never how
fast anything is.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ownwork(*args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "bench.ownwork", "--requests=200", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_ownwork_measures_the_servicer_and_pipeline() -> None:
    out = _ownwork()
    figure = re.search(r"own work per string-mode Detect .*: ([\d.]+) µs", out)
    assert figure is not None, out
    assert float(figure.group(1)) > 0


def test_ownwork_with_caches_disturbed() -> None:
    out = _ownwork("--cold=1")
    figure = re.search(r"caches disturbed \(1 MiB copied .*\): ([\d.]+) µs", out)
    assert figure is not None, out
    assert float(figure.group(1)) > 0
