"""SIGKILL at random instants, three times, then a run to the end: the output must be
byte for byte the output of an uninterrupted run (every input exactly once, in order).

When each kill lands is random (not seeded: after a random share of the images is
committed, plus a random delay); what is asserted is not: after every kill, any
output file that exists is complete and identical to the reference, and after the final run
all of them are, with the same counts. BATCH_KILL_ROUNDS=N repeats each case N times.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.support import datasets as data
from tests.support.batch import ok, run, start
from tests.support.gatewayproc import GatewayProcess

COUNT = 1040
# Checkpoints more often than the default 2 s, so one run commits several parts.
OPTIONS = ["--checkpoint-seconds", "0.3"]
ROUNDS = int(os.environ.get("BATCH_KILL_ROUNDS", "1"))
FORMS = ("directory", "tfrecord")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kill-data")
    images = data.make_images(COUNT, seed=1)
    return {
        "directory": data.write_directory(root / "directory", images),
        "tfrecord": data.write_tfrecords(root / "tfrecord", images, files=5, corrupt=500),
    }


def committed(out: Path) -> int:
    """Lines committed so far: finished output files plus checkpointed parts. The runner
    removes a part's directory once its output file is written, which may be in the middle
    of a scan: the scan then starts again."""
    while True:
        try:
            return _count(out)
        except FileNotFoundError:
            continue


def _count(out: Path) -> int:
    total = 0
    for path in out.glob("*.jsonl"):
        if not path.name.startswith(".tmp-"):  # a write in progress, or a killed one's
            total += path.read_bytes().count(b"\n")
    for part in out.glob("_batch/parts/*/*.jsonl"):
        start, _, end = part.stem.partition("-")
        if start.isdigit() and end.isdigit():
            total += int(end) - int(start)
    return total


def outputs(out: Path) -> dict[str, bytes]:
    """The finished output files (temporaries are not outputs)."""
    found = sorted(out.glob("*.jsonl"))
    return {p.name: p.read_bytes() for p in found if not p.name.startswith(".tmp-")}


@pytest.fixture(scope="module")
def references(
    datasets: dict[str, Path], gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[dict[str, bytes], dict[str, int], float]]:
    """Uninterrupted runs: output files, counts and seconds per form."""
    found = {}
    for form, source in datasets.items():
        out = tmp_path_factory.mktemp(f"reference-{form}")
        started = time.monotonic()
        summary = ok(run([str(source), str(out), "--target", gateway.target, *OPTIONS]))
        found[form] = (outputs(out), summary["codes"], time.monotonic() - started)
    return found


@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize("form", FORMS)
def test_sigkill_three_times_then_resume_gives_the_uninterrupted_output(
    form: str,
    round_: int,
    tmp_path: Path,
    datasets: dict[str, Path],
    references: dict[str, tuple[dict[str, bytes], dict[str, int], float]],
    gateway: GatewayProcess,
) -> None:
    reference, codes, seconds = references[form]
    out = tmp_path / "out"
    args = [str(datasets[form]), str(out), "--target", gateway.target, *OPTIONS]
    rng = random.Random()
    kills = []
    target = 0
    for _ in range(3):
        # Kill once a random further share of the images is committed, plus a random few
        # milliseconds, so kills land anywhere: mid-send, mid-commit, mid-finish.
        target += int(rng.uniform(0.1, 0.3) * COUNT)
        process = start(args, tmp_path / "runs.log")
        deadline = time.monotonic() + 10 * seconds + 30
        while process.poll() is None and committed(out) < target:
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.3))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills.append(committed(out))
        process.wait()
        for name, content in outputs(out).items():
            assert content == reference[name], f"{name} exists but differs after a kill"
    summary = ok(run(args))
    assert outputs(out) == reference
    assert summary["codes"] == codes
    job = json.loads((out / "summary.json").read_text())
    assert job["images"] == COUNT and job["codes"] == codes
    assert not [p for p in (out / "_batch" / "parts").rglob("*") if p.is_file()]
    assert not list(out.rglob(".tmp-*"))
    resumed = summary["this_run"]["resumed_after"]
    print(f"{form}: killed at {kills} committed lines, the last run resumed after {resumed}")
