"""The job store and the filter grammar, in-process (no gateway)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from gateway.domain import ModelRef
from gateway.errors import GatewayError, Kind
from gateway.jobs.control.paging import parse_filter
from gateway.jobs.control.store import JobStore
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job


def job(job_id: str, state: str = "QUEUED") -> Job:
    spec = JobSpec(input="/in", output="/out", task="detection")
    return Job(
        id=job_id, caller="c", spec=spec, executor="local", units=[], total=None, state=state
    )


def test_store_writes_nothing_until_the_first_job(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"))
    assert store.jobs() == [] and store.load("abc") is None
    assert not (tmp_path / "store").exists()


def test_create_if_absent_makes_one_record_under_racing_writers(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"))
    candidates = [job("abc123", state=f"QUEUED{i}") for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        created = list(pool.map(store.create, candidates))
    assert created.count(True) == 1
    winner = candidates[created.index(True)]
    assert store.load("abc123") == winner
    assert [j.id for j in store.jobs()] == ["abc123"]
    leftovers = [p.name for p in (tmp_path / "store" / "operations").iterdir()]
    assert sorted(leftovers) == [".lock", "abc123.json"]  # no temporaries left behind


def test_records_survive_a_new_store_object_and_ids_are_checked(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"))
    first = job("a1")
    store.create(first)
    first.state = "RUNNING"
    store.save(first)
    again = JobStore(str(tmp_path / "store")).load("a1")
    assert again is not None and again.state == "RUNNING"
    assert store.load("../a1") is None and store.load("A1") is None


@pytest.mark.parametrize(
    ("text", "states"),
    [
        ("", set()),
        ("state=RUNNING", {"RUNNING"}),
        ('metadata.state = "queued" OR state=CANCELLING', {"QUEUED", "CANCELLING"}),
        ("done=true", {"SUCCEEDED", "FAILED", "CANCELLED"}),
        ("done = false", {"QUEUED", "RUNNING", "CANCELLING"}),
    ],
)
def test_filters(text: str, states: set[str]) -> None:
    assert parse_filter(text) == states


@pytest.mark.parametrize("text", ["state=DONE", "name=x", "state=RUNNING AND done=true"])
def test_bad_filters_are_invalid_arguments(text: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse_filter(text)
    assert info.value.kind is Kind.INVALID_INPUT


def test_a_record_holds_the_job_spec_and_its_failure_as_a_kind(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"))
    spec = JobSpec(
        input="s3://bucket/in",
        output="/out",
        task="classification",
        model=ModelRef("classifier", None, "stable"),
        options={"top_k": 3, "min_score": 0.25},
        shards=2,
    )
    record = Job(id="ab12", caller="spiffe://a", spec=spec, executor="local",
                 units=[(0, "a.jsonl"), (1, "b.jsonl")], total=None)  # fmt: skip
    record.set_failure(GatewayError(Kind.PRECONDITION, "no"))
    assert store.create(record)
    again = store.load("ab12")
    assert again == record and again is not None
    assert again.spec.options == {"min_score": 0.25, "top_k": 3}
    assert again.failure is not None and again.failure.kind is Kind.PRECONDITION
    assert JobSpec.from_json(spec.to_json()) == spec


def test_a_marker_left_for_an_ended_job_goes_when_it_is_looked_at(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "store"))
    running, ended = job("a1", state="RUNNING"), job("e1")
    store.create(running)
    store.create(ended)
    store.update("e1", lambda j: setattr(j, "state", "SUCCEEDED") is None)
    # A replica marks the job it read as unfinished after another ended it.
    store.mark_active(["e1"])
    assert store.active() == ["a1"]
    (tmp_path / "store" / "active" / "e1").touch()  # one left behind by an older gateway
    (tmp_path / "store" / "active" / "b2").touch()  # and one whose record is gone
    assert store.live("e1") is None and store.live("b2") is None
    found = store.live("a1")
    assert found is not None and found.state == "RUNNING"
    assert store.active() == ["a1"]
