"""Skips are visible: a test that needs a tool or package that is missing is skipped with the
reason, or fails under CI=1 (CI installs every one: tests/support/tools.py), and the run ends
with one line that counts the skips by reason (tests/support/skipsummary.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NEEDS = """
from tests.support import tools

def test_needs_a_program():
    tools.binary("no-such-program-here", "apt-get install no-such-program-here")

def test_needs_a_package():
    tools.module("no_such_package_here", "pip install no-such-package-here")

def test_needs_nothing():
    pass
"""


def run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needs.py").write_text(NEEDS)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "tests.support.skipsummary", f"--rootdir={tmp_path}", "-c", os.devnull,
         str(tmp_path / "test_needs.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("ci", [None, "0"])
def test_outside_ci_a_missing_tool_skips_and_the_last_line_says_why(
    tmp_path: Path, ci: str | None
) -> None:
    done = run(tmp_path, ci)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert "1 passed, 2 skipped" in lines[-1]
    assert lines[-2] == (
        "skipped: 2 (1 x no-such-program-here is missing: apt-get install no-such-program-here; "
        "1 x the Python package no_such_package_here is missing: pip install no-such-package-here)"
    )


def test_under_ci_a_missing_tool_fails(tmp_path: Path) -> None:
    done = run(tmp_path, "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 failed, 1 passed" in done.stdout.strip().splitlines()[-1]
    assert "no-such-program-here is missing: apt-get install no-such-program-here (CI=1" in (
        done.stdout
    )
    assert "skipped: 0" in done.stdout


def test_every_slow_place_is_a_test_file_or_directory() -> None:
    from tests.conftest import SLOW, TESTS

    missing = [place for place in SLOW if not (TESTS / place).exists()]
    assert not missing, f"tests/conftest.py SLOW names places that are gone: {missing}"
