"""The reference SavedModels for the tests, exported once per version of what makes them.

Exporting the ten reference models (serving.export) takes about a minute of CPU (60 s user
time, 2026-11-29), minutes on a loaded machine. They are exported once per machine into
~/.cache/tfs-detection-gateway/models/<key> (tests/support/machinecache.py: shared by every
checkout and CI run), where the key is a hash of the files under serving/ that the export reads
and of TensorFlow's version, so a change to a model's code exports them again. `make test`
exports before pytest starts (`make test-models`), outside any test's timeout; the tests'
`model_repo` fixture copies them from there, and exports them itself when the cache is missing.
A checkout's own .cache/models/<key> from before the machine cache is still read.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from importlib import metadata
from pathlib import Path

from tests.support import machinecache

ROOT = Path(__file__).resolve().parents[2]
LEGACY_CACHE = ROOT / ".cache" / "models"  # read, never written
VERSION = 1
_COMPLETE = ".complete"


# serving/'s files the export does not read: the configs that serve the models.
_NOT_READ = {"models.config", "gateway-models.toml", "batching.config", "monitoring.config"}


def sources() -> list[Path]:
    """The files the export reads: serving/'s own modules and data, not the local server's
    nor the configs that serve the exported models (editing those exports nothing again)."""
    serving = ROOT / "serving"
    return sorted(
        p
        for p in serving.iterdir()
        if p.is_file() and p.suffix != ".pyc" and p.name not in _NOT_READ
    )


def key() -> str:
    digest = hashlib.sha256(metadata.version("tensorflow").encode())
    for path in sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def export(directory: Path) -> Path:
    """Exports version VERSION of every reference model into `directory`."""
    from serving.export import export_models

    export_models(directory, version=VERSION)
    return directory


def cached() -> Path:
    """The exported models for the current sources, exporting them if they are not there yet
    (once per machine: concurrent callers wait for the one export)."""
    name = key()
    legacy = LEGACY_CACHE / name
    if (legacy / _COMPLETE).exists():
        return legacy
    return machinecache.build_once("models", name, export)


def copy_to(directory: Path) -> Path:
    """The cached models copied into `directory` (a test may change its copy)."""
    skip = shutil.ignore_patterns(_COMPLETE, machinecache.USED, ".lock")
    shutil.copytree(cached(), directory, dirs_exist_ok=True, ignore=skip)
    return directory


def main() -> None:
    path = cached()
    sys.stdout.write(f"reference models for the tests: {path}\n")


if __name__ == "__main__":
    main()
