"""The gateway never loads TensorFlow (it would cost ~4 s and ~600 MB per process)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import gateway

ROOT = Path(__file__).resolve().parents[1]


def test_importing_every_gateway_module_leaves_tensorflow_unloaded() -> None:
    # The `make run` launcher (tools/devrun.py) lives outside the package: it imports serving/.
    modules = [m.name for m in pkgutil.walk_packages(gateway.__path__, "gateway.")]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'tensorflow_serving', 'keras'))\n"
        "assert not loaded, loaded\n"
        "print(len(sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert len(modules) > 10
