"""What the tests build once per machine, shared by every checkout and CI run on it: the
reference SavedModels (tests/support/models.py), the model zoos (tests/zoo/cache.py), the
zoo exporters' venv (`make zoo-venv`) and Ultralytics' (`make ultralytics-venv`), like the
peers' venvs (bench/peers/venvs.py).

Each lives in `~/.cache/tfs-detection-gateway/<kind>/<key>/`, the key being a hash of what
makes it (sources, pinned versions), so a change builds a new one beside the old and nothing
is ever half-updated: a build holds a lock on `<kind>/` (two checkouts building at once build
it once), and an entry counts only once its `.complete` marker is written. `GATEWAY_TEST_CACHE`
names another directory instead. Entries unused for PRUNE_DAYS go when a new one is built.

Standard library only: `make zoo-venv` runs this with the system Python, before any venv.

    python3 -m tests.support.machinecache zoo-venv .venv-zoo constraints-zoo.txt PACKAGE...
    python3 -m tests.support.machinecache ultralytics-venv .venv-ultralytics \
        constraints-ultralytics.txt PACKAGE... --no-deps PACKAGE...
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPLETE = ".complete"
USED = ".used"  # touched at each use: what prune() keeps
PRUNE_DAYS = 7
# The venvs kept here (`make zoo-venv`, `make ultralytics-venv`) and what main() calls them.
VENVS = {"zoo-venv": "the zoo's venv", "ultralytics-venv": "Ultralytics' venv"}
NO_DEPS = "--no-deps"


def cache_root() -> Path:
    found = os.environ.get("GATEWAY_TEST_CACHE")
    return Path(found) if found else Path.home() / ".cache" / "tfs-detection-gateway"


def place(kind: str, key: str) -> Path:
    return cache_root() / kind / key


def complete(directory: Path) -> bool:
    return (directory / COMPLETE).exists()


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _touch(directory: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only cache still serves
        (directory / USED).touch()


def prune(kind_dir: Path, keep: Path) -> None:
    """Entries of `kind_dir` other than `keep` that nobody used for PRUNE_DAYS (call it
    holding the lock)."""
    horizon = time.time() - PRUNE_DAYS * 86400
    for entry in kind_dir.iterdir():
        if not entry.is_dir() or entry == keep:
            continue
        stamp = entry / USED if (entry / USED).exists() else entry
        if stamp.stat().st_mtime < horizon:
            shutil.rmtree(entry, ignore_errors=True)


def build_once(kind: str, key: str, build: Callable[[Path], None]) -> Path:
    """`<kind>/<key>`, built by `build(directory)` first unless a complete one is there.
    `build` fills the empty directory it is given; raising leaves nothing that counts."""
    target = place(kind, key)
    if not complete(target):
        with locked(target.parent):
            if not complete(target):  # another build may have finished while we waited
                shutil.rmtree(target, ignore_errors=True)  # what an interrupted build left
                target.mkdir(parents=True)
                build(target)
                (target / COMPLETE).touch()
                prune(target.parent, keep=target)
    _touch(target)
    return target


def venv_key(constraints: Path, packages: Sequence[str]) -> str:
    digest = hashlib.sha256(platform.python_version().encode())
    digest.update(constraints.read_bytes() + b"\0" + " ".join(packages).encode())
    return digest.hexdigest()[:16]


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], check=True)


def _install(python: Path, constraints: Path, packages: Sequence[str]) -> None:
    """pip installs `packages` under `constraints`; those after `--no-deps` without their
    dependencies (`torch numpy --no-deps ultralytics`)."""
    cut = packages.index(NO_DEPS) if NO_DEPS in packages else len(packages)
    _pip(python, "--upgrade", "pip")
    _pip(python, "-c", str(constraints), *packages[:cut])
    if packages[cut + 1 :]:
        _pip(python, "--no-deps", "-c", str(constraints), *packages[cut + 1 :])


def shared_venv(kind: str, link: Path, constraints: Path, packages: Sequence[str]) -> Path:
    """A venv with `packages` at `link`. A directory already there that is not a link into the
    cache (a checkout's own venv from before the cache) is updated in place, as it was; else
    `link` becomes a symlink to the machine's `<kind>/<key>` venv for these pins, built when
    missing."""
    cache = cache_root()
    if link.exists() and not link.resolve().is_relative_to(cache.resolve()):
        _install(link / "bin" / "python", constraints, packages)
        return link

    def build(directory: Path) -> None:
        print(f"building {directory} ({' '.join(packages)}) ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(directory)
        _install(directory / "bin" / "python", constraints, packages)

    target = build_once(kind, venv_key(constraints, packages), build)
    if link.is_symlink() or not link.exists():
        scratch = link.with_name(f"{link.name}.link-{os.getpid()}")
        scratch.unlink(missing_ok=True)
        scratch.symlink_to(target, target_is_directory=True)
        scratch.replace(link)  # atomic: a reader sees the old link or the new one
    return target


def main(argv: Sequence[str]) -> None:
    if len(argv) < 4 or argv[0] not in VENVS:
        raise SystemExit(__doc__)
    kind, link, constraints, packages = argv[0], Path(argv[1]), Path(argv[2]), argv[3:]
    target = shared_venv(kind, link, ROOT / constraints, packages)
    print(f"{VENVS[kind]}: {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
