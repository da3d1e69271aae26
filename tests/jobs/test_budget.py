"""The runner charges every result byte it writes into the job store against the store's
bound (issue 33 item 2): a job whose results do not fit fails RESOURCE_EXHAUSTED naming
GATEWAY_JOB_STORE_MAX_BYTES, and the results it wrote stay within the bound."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gateway.batch.budget import BudgetSpent
from gateway.jobs.budget import MEASURE_SECONDS, StoreBudget
from tests.support.jobs import Client, State, gateway, make_images, metadata
from tests.support.localserver import LocalServer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reservations_and_releases_count_between_measures() -> None:
    on_disk = [100]
    measures = []

    def usage() -> int:
        measures.append(on_disk[0])
        return on_disk[0]

    clock = Clock()
    budget = StoreBudget(usage, 1000, clock)
    budget.reserve(500)
    budget.reserve(300)
    assert budget.used == 900 and len(measures) == 1
    with pytest.raises(BudgetSpent, match=r"holds 900 of its 1000 bytes \(GATEWAY_JOB_STORE_MAX"):
        budget.reserve(101)
    budget.reserve(100)  # exactly the bound
    budget.release(300)  # deleted
    budget.reserve(250)
    assert budget.used == 950 and len(measures) == 1
    on_disk[0] = 980  # what reached the store, others' writes included
    clock.now += MEASURE_SECONDS + 1
    with pytest.raises(BudgetSpent, match="holds 980 of its 1000 bytes"):
        budget.reserve(21)
    assert len(measures) == 2
    on_disk[0] = 400  # operations deleted meanwhile: seen at the next measure
    clock.now += MEASURE_SECONDS + 1
    budget.reserve(600)
    assert budget.used == 1000


def store_bytes(store: Path) -> int:
    """Bytes of the files below `store` (what the bound counts; directories are not)."""
    return sum(p.stat().st_size for p in store.rglob("*") if p.is_file())


def test_a_job_whose_results_do_not_fit_the_store_fails_naming_the_bound(
    tfs: LocalServer, tmp_path: Path, store: Path
) -> None:
    images = tmp_path / "images"
    make_images(images, 300)
    bound = 96 * 1024
    extra = [f"--job-store-max-bytes={bound}"]
    with gateway(tfs, store, tmp_path, extra) as gw, gw.channel() as channel:
        client = Client(channel)
        done = client.wait(client.create(input_uri=str(images)).name, 300)
        meta = metadata(done)
        assert meta.state == State.FAILED
        assert done.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], done.error
        assert "GATEWAY_JOB_STORE_MAX_BYTES" in done.error.message
        assert 0 < meta.processed <= 300  # what fitted is kept, readable
        assert len(client.lines(done.name)) == meta.processed
        results = store_bytes(store / "jobs")
        assert results <= bound, results
