"""The store's tally (gateway.jobs.control.tally): reservations by racing threads never pass the
store's bound or a caller's share, refusals name the setting, and a job's Budget charges its
result bytes ahead in steps and gives back what it did not use."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from gateway.errors import GatewayError, Kind
from gateway.jobs.control.store import JobStore
from gateway.jobs.control.tally import OVERHEAD
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job


def test_racing_reservations_stop_exactly_at_the_bound(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"), max_bytes=OVERHEAD + 1000)

    def reserve(_: int) -> bool:
        try:
            store.tally.reserve(30, "alice", 600)
            return True
        except GatewayError as e:
            assert e.kind is Kind.OVERLOADED
            return False

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(reserve, range(40)))
    assert got.count(True) == 20  # 20 x 30 = 600, the caller's share
    tally = store.tally.read()
    assert tally["bytes"] == 600 and tally["callers"]["alice"]["bytes"] == 600
    with pytest.raises(GatewayError, match="GATEWAY_BATCH_MAX_UPLOAD_BYTES_PER_CALLER"):
        store.tally.reserve(1, "alice", 600)
    store.tally.reserve(400, "bob", 600)
    with pytest.raises(GatewayError, match="GATEWAY_JOB_STORE_MAX_BYTES"):
        store.tally.reserve(1)
    store.tally.release(600, "alice")
    assert store.tally.read()["bytes"] == 400 and "alice" not in store.tally.read()["callers"]


def test_open_uploads_are_counted_in_one_write(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"), max_bytes=1 << 20)

    def open_one(_: int) -> bool:
        try:
            store.tally.open_upload("alice", 2)
            return True
        except GatewayError as e:
            assert "GATEWAY_BATCH_MAX_UPLOADS_PER_CALLER" in e.message
            return False

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        assert list(pool.map(open_one, range(10))).count(True) == 2


def test_a_budget_charges_ahead_and_gives_back_the_rest(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"), max_bytes=64 << 20)
    job = Job(id="ab", caller="c", spec=JobSpec(input="/in", output="/out", task="detection"),
              executor="local", units=[], total=None)  # fmt: skip
    assert store.create(job)
    record = store.tally.used()  # the record's own bytes, reserved as it was created
    assert record == job.charged and 4096 < record < 8192
    writes = store.tally.read()["generation"]
    budget = store.budget(job.id)
    for _ in range(100):
        budget.charge(1000)  # 100 KB in one step reserved ahead: one tally write
    assert store.tally.read()["generation"] == writes + 1

    def charged() -> int:
        found = store.load(job.id)
        assert found is not None
        return found.charged

    step = min(1 << 20, store.tally.limit // 64)  # reserved ahead: 1 MiB, less in a small store
    assert store.tally.used() == record + step and charged() == record + step
    budget.close()
    assert store.tally.used() == record + 100_000 and charged() == record + 100_000
    # Past the bound: refused, naming the setting; what is left still fits.
    with pytest.raises(GatewayError, match="GATEWAY_JOB_STORE_MAX_BYTES") as info:
        store.budget(job.id).charge(64 << 20)
    assert info.value.kind is Kind.OVERLOADED
    store.budget(job.id).charge(store.tally.room())
    assert store.tally.room() == 0
    # Deleting the job gives back everything it was charged.
    assert store.forget(job)
    assert store.tally.used() == 0
