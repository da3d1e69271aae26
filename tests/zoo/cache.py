"""The model zoo built once per machine and content: `~/.cache/tfs-detection-gateway/zoo/<key>`
(tests/support/machinecache.py), the key being a hash of the builder's source and the venv's
pinned versions (constraints-zoo.txt), so a change to either builds the zoo again (about 5
minutes on 2 idle cores) and every checkout and CI run of the same sources on the machine uses
one build. `make zoo` builds it before pytest starts, outside any test's timeout; the `zoo`
fixture builds it when the cache has none. A checkout's own `.cache/zoo/<key>` from before the
machine cache is still read.

    python -m tests.zoo.cache      # `make zoo`: build what is missing, print the directory
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from tests.support import machinecache, tools

ROOT = Path(__file__).resolve().parents[2]
BUILDER = Path(__file__).with_name("build.py")
# The builder and the modules it imports: a change to any builds the zoo again.
SOURCES = [
    BUILDER,
    *(
        BUILDER.with_name(f"{m}.py")
        for m in ("classifiers", "detectors", "embedders", "keypointers", "ties")
    ),
]
ZOO_PYTHON = ROOT / ".venv-zoo" / "bin" / "python"
CONSTRAINTS = ROOT / "constraints-zoo.txt"
LEGACY_CACHE = ROOT / ".cache" / "zoo"  # read, never written
BUILD_TIMEOUT = 3600  # seconds; about 5 minutes on an idle 2-core machine


class ZooBuildError(RuntimeError):
    """The builder failed; the message quotes its log."""


def zoo_key() -> str:
    digest = hashlib.sha256()
    for path in (*SOURCES, CONSTRAINTS):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _build(directory: Path) -> None:
    log = directory.with_name(f"{directory.name}.log")
    with log.open("wb") as out:
        result = subprocess.run(
            [str(ZOO_PYTHON), str(BUILDER), str(directory)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise ZooBuildError(f"building the zoo failed (exit {result.returncode}); {log}:\n{tail}")
    log.unlink(missing_ok=True)


def build_zoo() -> Path:
    """The zoo's directory, built first when no cache has one for this key."""
    key = zoo_key()
    legacy = LEGACY_CACHE / key
    if (legacy / "expected.json").exists():
        return legacy
    if not machinecache.complete(machinecache.place("zoo", key)) and not ZOO_PYTHON.exists():
        tools.missing(str(ZOO_PYTHON), "run `make zoo-venv` (make test does)")
    return machinecache.build_once("zoo", key, _build)


if __name__ == "__main__":
    sys.stdout.write(f"the zoo: {build_zoo()}\n")
