"""The runner charges every result byte it writes into the job store against the store's
bound (issue 33 item 2): a job whose results do not fit fails RESOURCE_EXHAUSTED naming
GATEWAY_JOB_STORE_MAX_BYTES, and the results it wrote stay within the bound."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gateway.jobs.control.store import JobStore
from gateway.jobs.control.store_budget import TallyBudget
from gateway.jobs.runner.budget import BudgetSpent
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job
from tests.support.jobs import Client, State, gateway, make_images, metadata
from tests.support.localserver import LocalServer


def test_charges_go_to_the_tally_and_deleted_bytes_come_back(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"), max_bytes=(64 << 10) + (40 << 10))
    spec = JobSpec(input="/data", output="/out", task="detection")
    job = Job(id="ab12", caller="a", spec=spec, executor="local", units=[], total=None)
    assert store.create(job)
    base = store.tally.used()  # the record's own reservation
    budget = TallyBudget(store, "ab12")
    budget.reserve(10_000)
    budget.reserve(20_000)
    with pytest.raises(BudgetSpent, match="GATEWAY_JOB_STORE_MAX_BYTES"):
        budget.reserve(20_000)
    budget.release(15_000)  # parts an output file replaced
    budget.reserve(20_000)
    budget.close()
    record = store.load("ab12")
    assert record is not None and record.charged == base + 35_000
    assert store.tally.used() == base + 35_000


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
