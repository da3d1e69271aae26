"""The model zoo built once per machine and content: `~/.cache/tfs-detection-gateway/zoo/<key>`
(tests/support/machinecache.py), the key being a hash of the builder's source and the venv's
pinned versions (constraints-zoo.txt), so a change to either builds the zoo again (about 5
minutes on 2 idle cores) and every checkout and CI run of the same sources on the machine uses
one build. `make zoo` builds it before pytest starts, outside any test's timeout; the `zoo`
fixture builds it when the cache has none. A checkout's own `.cache/zoo/<key>` from before the
machine cache is still read.

The segmentation zoo (tests/zoo/segmenters.py: the Model Garden Mask R-CNN and the YOLOv8-seg
layout, with Ultralytics' own masks as the reference, tests/zoo/ultralytics_masks.py in
`.venv-ultralytics`) is built apart, so the shared zoo's key does not change with it:
`~/.cache/tfs-detection-gateway/zoo-segmentation/<key>`, the exports and the library's masks in
one entry (about 2 minutes on 2 cores), also by `make zoo`.

    python -m tests.zoo.cache      # `make zoo`: build what is missing, print the directories
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterable
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
# The segmentation zoo's builder, what it imports and the reference's script and pins.
SEGMENTERS = BUILDER.with_name("segmenters.py")
ULTRALYTICS_MASKS = BUILDER.with_name("ultralytics_masks.py")
SEGMENTATION_SOURCES = [
    SEGMENTERS,
    BUILDER,
    BUILDER.with_name("keypointers.py"),
    ULTRALYTICS_MASKS,
    CONSTRAINTS,
    ROOT / "constraints-ultralytics.txt",
]
ULTRALYTICS_PYTHON = ROOT / ".venv-ultralytics" / "bin" / "python"
LEGACY_SEGMENTATION = ROOT / ".cache" / "zoo-segmentation"  # read, never written
BUILD_TIMEOUT = 3600  # seconds; about 5 minutes on an idle 2-core machine


class ZooBuildError(RuntimeError):
    """The builder failed; the message quotes its log."""


def _key(paths: Iterable[Path]) -> str:
    """A cache key: the hash of what makes the build, file after file."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def zoo_key() -> str:
    return _key((*SOURCES, CONSTRAINTS))


def _run(python: Path, script: Path, directory: Path) -> None:
    """`python script directory`, its output in a log beside `directory` kept on failure."""
    log = directory.with_name(f"{directory.name}.log")
    with log.open("wb") as out:
        result = subprocess.run(
            [str(python), str(script), str(directory)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise ZooBuildError(
            f"building the zoo failed ({script.name}, exit {result.returncode}); {log}:\n{tail}"
        )
    log.unlink(missing_ok=True)


def _build(directory: Path) -> None:
    _run(ZOO_PYTHON, BUILDER, directory)


def build_zoo() -> Path:
    """The zoo's directory, built first when no cache has one for this key."""
    key = zoo_key()
    legacy = LEGACY_CACHE / key
    if (legacy / "expected.json").exists():
        return legacy
    if not machinecache.complete(machinecache.place("zoo", key)) and not ZOO_PYTHON.exists():
        tools.missing(str(ZOO_PYTHON), "run `make zoo-venv` (make test does)")
    return machinecache.build_once("zoo", key, _build)


def segmentation_key() -> str:
    return _key(SEGMENTATION_SOURCES)


def _build_segmentation(directory: Path) -> None:
    _run(ZOO_PYTHON, SEGMENTERS, directory)  # the exports and their raw outputs
    _run(ULTRALYTICS_PYTHON, ULTRALYTICS_MASKS, directory)  # the library's masks of those


def segmentation_complete(directory: Path) -> bool:
    return (directory / "expected.json").exists() and (
        directory / "ultralytics" / "done.json"
    ).exists()


def build_segmentation_zoo() -> Path:
    """The segmentation zoo's directory (exports, expected.json, the library's masks in
    ultralytics/), built first when no cache has one for this key."""
    key = segmentation_key()
    legacy = LEGACY_SEGMENTATION / key
    if segmentation_complete(legacy):
        return legacy
    if not machinecache.complete(machinecache.place("zoo-segmentation", key)):
        for python, make in ((ZOO_PYTHON, "zoo-venv"), (ULTRALYTICS_PYTHON, "ultralytics-venv")):
            if not python.exists():
                tools.missing(str(python), f"run `make {make}` (make test does)")
    return machinecache.build_once("zoo-segmentation", key, _build_segmentation)


if __name__ == "__main__":
    sys.stdout.write(f"the zoo: {build_zoo()}\n")
    sys.stdout.write(f"the segmentation zoo: {build_segmentation_zoo()}\n")
