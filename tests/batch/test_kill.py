"""SIGKILL at random instants, three times, then a run to the end: the output must be
byte for byte the output of an uninterrupted run (every input exactly once, in order).

When each kill lands is random (not seeded); what is asserted is not: after every kill, any
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

from tests.batch import data
from tests.batch.helpers import ok, run, start
from tests.gateway.gatewayproc import GatewayProcess

COUNT = 1040
# Fewer images in flight than the runner's default make a run last long enough (several
# seconds) for kills to land in the middle of it.
SLOW = ["--concurrency", "8", "--checkpoint-seconds", "0.3"]
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


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}


@pytest.fixture(scope="module")
def references(
    datasets: dict[str, Path], gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[dict[str, bytes], dict[str, int], float]]:
    """Uninterrupted runs: output files, counts and seconds per form."""
    found = {}
    for form, source in datasets.items():
        out = tmp_path_factory.mktemp(f"reference-{form}")
        started = time.monotonic()
        summary = ok(run([str(source), str(out), "--target", gateway.target, *SLOW]))
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
    args = [str(datasets[form]), str(out), "--target", gateway.target, *SLOW]
    rng = random.Random()
    kills = []
    for _ in range(3):
        process = start(args, tmp_path / "runs.log")
        time.sleep(rng.uniform(0.3, max(0.4, 0.5 * seconds)))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills.append(round(time.monotonic(), 2))
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
    print(f"{form}: {len(kills)} kills, resumed after {summary['this_run']['resumed_after']}")
