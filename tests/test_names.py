"""The names a user meets say what the gateway is (a gateway for vision models, not only a
detector): the distribution, its console scripts and its metrics; the first release's names
stay as aliases until the next release (CHANGELOG.md says so)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RENAMED = {"detection-gateway": "vision-gateway", "detection-client": "vision-client",
           "detection-batch": "vision-batch"}  # fmt: skip


def test_the_distribution_and_its_scripts_are_named_for_vision() -> None:
    assert PROJECT["name"] == "tfs-vision-gateway"
    scripts = PROJECT["scripts"]
    for old, new in RENAMED.items():
        assert scripts[new] == scripts[old], (old, new)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert all(old in changelog and new in changelog for old, new in RENAMED.items())


@pytest.mark.parametrize("script", sorted({*RENAMED, *RENAMED.values()}))
def test_each_script_is_installed_and_answers_help(script: str) -> None:
    found = shutil.which(script, path=str(Path(sys.executable).parent))
    assert found, f"{script} is not installed next to {sys.executable}: make venv"
    done = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stderr
