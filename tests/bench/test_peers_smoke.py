"""`python -m bench.peers --quick`: the gateway, seed 002's gateway, a KServe transformer and an
MLServer runtime all start, give the right answer at every door, take load without errors,
and the section is written beside the others. A smoke test: never how fast anything is.

bench.peers itself refuses to measure a server whose answer (boxes in pixels, labels,
scores) differs from what the bench upstream's outputs give, so a peer that answers wrongly
fails this test. It needs the peers' venvs and h2load (`make peers`, which `make test` runs
first); run by hand without them it is skipped, in CI (CI=true) it fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]
DOORS = (
    "gateway gRPC",
    "seed 002 gRPC",
    "MLServer gRPC",
    "do-nothing proxy gRPC",
    "gateway HTTP",
    "KServe REST",
    "MLServer REST",
    "do-nothing proxy HTTP",
)


def _missing() -> tuple[str, str] | None:
    if shutil.which("h2load") is None:
        return "h2load", "make peers installs Debian's nghttp2-client"
    check = subprocess.run(
        [sys.executable, "-m", "bench.peers.venvs", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        return "the peers' venvs", f"make peers ({check.stderr.strip()})"
    return None


@pytest.mark.timeout(900)  # the run's own limit is 600 s
def test_quick_peers_bench_checks_every_answer_and_writes_its_section(tmp_path: Path) -> None:
    missing = _missing()
    if missing is not None:
        tools.missing(*missing)
    out = tmp_path / "results.md"
    others = "<!-- begin bench -->\n## Another section\n<!-- end bench -->\n"
    out.write_text(others)
    run = subprocess.run(
        [sys.executable, "-m", "bench.peers", "--quick", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # inside the test's own limit, so a hang fails here with its output
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = out.read_text()
    assert report.startswith(others) and report.count("<!-- begin peers -->") == 1
    section = report.split("<!-- begin peers -->")[1]
    # Every door of every server took its requests at both concurrencies without an error
    # (a quick run sends a fixed number of requests, not load for a time).
    for door in DOORS:
        rows = [
            line.split("|")
            for line in section.splitlines()
            if f"| {door} |" in line and " ms |" in line  # the door's row, not a ratio's
        ]
        assert len(rows) == 1, door
        cells = [cell.strip() for cell in rows[0]]
        rate_c1, rate_c16, errors = cells[3], cells[5], cells[9]
        assert float(rate_c1) > 0 and float(rate_c16) > 0 and errors == "0", rows[0]
    verdicts = re.findall(r"\| (met|\*\*not met\*\*)[^|]*\|$", section, re.MULTILINE)
    assert len(verdicts) == 4  # CPU and requests/s, each door, one image in a quick run
    for server in ("gateway", "seed 002", "KServe", "MLServer"):
        assert re.search(rf"^\| {server} \| [\d.]+ s \| \d+ MiB \| \d+ MiB \|$", section, re.M)
