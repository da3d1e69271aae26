"""OUTPUT's fence (gateway.jobs.runner.fence): once it refuses, the run writes and deletes nothing,
whichever commit it attempts (a part, an output file, a marker, the stray parts of a resume);
and its answer is used only before the lease it names runs out (a gateway paused between its
check of the lease and its answer, as tests/jobs/executors/test_lease_fence.py pauses one,
gives an answer its runner must not commit on)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.jobs.runner import storage
from gateway.jobs.runner.fence import LOST, LeaseLost, until_in_time
from gateway.jobs.runner.output import Counts, Output


class Switch:
    """A fence that lets commits through until `lost` is set."""

    def __init__(self) -> None:
        self.lost = False
        self.checks = 0

    def check(self) -> None:
        self.checks += 1
        if self.lost:
            raise LeaseLost("another process holds the job")


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_refusing_fence_stops_every_write_and_deletion(tmp_path: Path) -> None:
    fence = Switch()
    out = Output(storage.resolve(str(tmp_path / "out")), fence=fence)
    counts = Counts()
    counts.codes["OK"] = 2
    first = out.commit_part("u.jsonl", 0, [b"{}\n", b"{}\n"], counts)
    out.commit_part("u.jsonl", 1, [b"{}\n", b"{}\n"], counts)  # off the chain: stray
    out.write_json("_batch/job.json", {"format_version": 2})
    assert fence.checks == 3
    before = files(tmp_path)

    fence.lost = True
    attempts = [
        lambda: out.commit_part("u.jsonl", 2, [b"{}\n"], counts),
        lambda: out.write_json("_SUCCESS.00000", {}),
        lambda: out.finish_unit("u.jsonl", [first], counts),
        lambda: out.resume_point("u.jsonl"),  # would delete the stray part
        lambda: out.clean_unit("u.jsonl"),
        lambda: out.remove_temporaries(0, ["u.jsonl"], True),
    ]
    for attempt in attempts:
        with pytest.raises(LeaseLost):
            attempt()
    assert files(tmp_path) == before


def test_a_lease_held_until_later_lets_the_commit_go() -> None:
    until_in_time(time.time() + 30)


def test_a_lease_not_held_stops_the_commit() -> None:
    with pytest.raises(LeaseLost, match="another gateway process holds"):
        until_in_time(0.0)


def test_an_answer_that_arrives_after_the_lease_ran_out_stops_the_commit() -> None:
    with pytest.raises(LeaseLost) as lost:
        until_in_time(time.time() - 0.001)
    assert str(lost.value) == f"{LOST} (its lease ran out before the commit)"
