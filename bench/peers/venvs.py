"""The peers' own venvs (KServe, MLServer), built from the pinned lists beside this file.

Each is about 2.4 GB (TensorFlow, which the official tensorflow-serving-api needs), so they
are built once per machine and shared by every checkout and CI run on it: they live in
`~/.cache/tfs-detection-gateway/peers/<key>/`, where the key is a hash of the two lists
and the Python version, so a changed list builds new venvs beside the old ones and nothing
is ever half-updated. A build holds a lock on the directory (two checkouts running
`make peers` at once build it once) and marks a venv complete only when its install
finished. `PEERS_DIR` names another directory instead.

    python -m bench.peers.venvs            # `make peers`: build what is missing, print the dir
    python -m bench.peers.venvs --check    # exit 1 unless both venvs are complete
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
LISTS = {"kserve": HERE / "kserve.txt", "mlserver": HERE / "mlserver.txt"}
CACHE = Path.home() / ".cache" / "tfs-detection-gateway" / "peers"
COMPLETE = ".complete"


def directory() -> Path:
    if os.environ.get("PEERS_DIR"):
        return Path(os.environ["PEERS_DIR"])
    digest = hashlib.sha256(platform.python_version().encode())
    for name, path in sorted(LISTS.items()):
        digest.update(name.encode() + b"\0" + path.read_bytes())
    return CACHE / digest.hexdigest()[:16]


def python(name: str) -> Path:
    """The venv's interpreter; SystemExit naming `make peers` when it is not built."""
    found = directory() / name / "bin" / "python"
    if not (directory() / name / COMPLETE).exists():
        raise SystemExit(f"the {name} venv is missing ({found}): run `make peers` to build it")
    return found


def build(name: str) -> Path:
    root = directory()
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (target / COMPLETE).exists():
            return target
        shutil.rmtree(target, ignore_errors=True)  # what an interrupted build left
        print(f"building {target} (about 2.4 GB: TensorFlow) ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(target)
        subprocess.run(
            [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", "--no-deps", "-r", str(LISTS[name])],
            check=True,
        )  # fmt: skip
        (target / COMPLETE).write_text(LISTS[name].read_text())
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether they are built")
    args = parser.parse_args()
    if args.check:
        missing = [n for n in LISTS if not (directory() / n / COMPLETE).exists()]
        if missing:
            print(f"missing in {directory()}: {', '.join(missing)}", file=sys.stderr)
            raise SystemExit(1)
    else:
        for name in LISTS:
            build(name)
    print(directory())


if __name__ == "__main__":
    main()
