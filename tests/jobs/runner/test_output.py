"""OUTPUT's checkpoints: which committed parts a restart keeps, and which temporaries go."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.jobs.runner import storage
from gateway.jobs.runner.fence import LeaseLost
from gateway.jobs.runner.output import Counts, Output, committed


def output(tmp_path: Path) -> Output:
    return Output(storage.resolve(str(tmp_path / "out")))


def lines(start: int, end: int) -> list[bytes]:
    return [f'{{"n": {n}}}\n'.encode() for n in range(start, end)]


def ok_counts(n: int) -> Counts:
    counts = Counts()
    counts.codes["OK"] = n
    return counts


def test_resume_keeps_the_chain_from_zero_and_drops_the_rest(tmp_path: Path) -> None:
    out = output(tmp_path)
    out.commit_part("u.jsonl", 0, lines(0, 3), ok_counts(3))
    out.commit_part("u.jsonl", 3, lines(3, 5), ok_counts(2))
    out.commit_part("u.jsonl", 2, lines(2, 6), ok_counts(4))  # a duplicate cut elsewhere
    out.commit_part("u.jsonl", 9, lines(9, 10), ok_counts(1))  # after a gap
    position, parts, counts = out.resume_point("u.jsonl")
    assert position == 5 and counts.codes == {"OK": 5}
    assert [Path(p).name for p in parts] == ["000000000000-000000000003.jsonl",
                                             "000000000003-000000000005.jsonl"]  # fmt: skip
    left = sorted(p.name for p in Path(out.parts_dir("u.jsonl")).iterdir())
    assert left == [Path(p).name for p in parts]
    out.finish_unit("u.jsonl", parts, counts)
    assert (tmp_path / "out" / "u.jsonl").read_bytes() == b"".join(lines(0, 5))
    assert out.unit_done("u.jsonl") is not None
    assert not Path(out.parts_dir("u.jsonl")).exists()


def test_a_part_with_the_wrong_line_count_ends_the_chain(tmp_path: Path) -> None:
    out = output(tmp_path)
    out.commit_part("u.jsonl", 0, lines(0, 2), ok_counts(2))
    bad = Path(out.parts_dir("u.jsonl")) / "000000000002-000000000004.jsonl"
    bad.write_bytes(b'{"codes": {}}\n{"n": 2}\n')  # named for 2 lines, its header counts 0
    assert out.resume_point("u.jsonl")[0] == 2


def test_temporaries_of_this_shard_go_and_other_shards_stay(tmp_path: Path) -> None:
    out = output(tmp_path)
    root = tmp_path / "out"
    (root / "_batch" / "done").mkdir(parents=True)
    mine = [root / ".tmp-aa-_SUCCESS.00001", root / ".tmp-bb-p1.jsonl",
            root / "_batch" / "done" / ".tmp-cc-p1.jsonl.json"]  # fmt: skip
    theirs = [root / ".tmp-dd-_SUCCESS.00000", root / ".tmp-ee-summary.json"]
    for path in mine + theirs:
        path.write_bytes(b"half")
    out.remove_temporaries(1, ["p1.jsonl"], alone=False)
    assert [p.exists() for p in mine] == [False, False, False]
    assert [p.exists() for p in theirs] == [True, True]
    out.remove_temporaries(0, [], alone=True)
    assert [p.exists() for p in theirs] == [False, False]


def test_resume_reads_parts_whole_and_progress_reads_headers(tmp_path: Path) -> None:
    out = output(tmp_path)
    out.commit_part("u.jsonl", 0, lines(0, 2), ok_counts(2))
    short = Path(out.parts_dir("u.jsonl")) / "000000000002-000000000004.jsonl"
    short.write_bytes(b'{"codes": {"OK": 2}}\n{"n": 2}\n')  # its header counts 2, it holds 1
    assert committed(out.fs, out.parts_dir("u.jsonl")).lines == 4
    assert out.resume_point("u.jsonl")[0] == 2
    assert not short.exists()  # off the chain a resumed run keeps: deleted


def test_the_fence_is_checked_after_the_budget_right_before_the_write(tmp_path: Path) -> None:
    """A reservation may wait for a stalled gateway while another process takes the job; a
    fence passed before that wait let the old holder write after it (CI: test_lease_fence's
    'a holder without its lease wrote'). The fence comes last, and a refused write gives its
    bytes back."""
    steps: list[str] = []

    class Budget:
        def reserve(self, size: int) -> None:
            steps.append("reserve")

        def release(self, size: int) -> None:
            steps.append("release")

    class Fence:
        def __init__(self) -> None:
            self.lost = False

        def check(self) -> None:
            steps.append("fence")
            if self.lost:
                raise LeaseLost("another process holds the job")

    fence = Fence()
    out = Output(storage.resolve(str(tmp_path / "out")), Budget(), fence)
    out.commit_part("a.jsonl", 0, lines(0, 2), ok_counts(2))
    assert steps == ["reserve", "fence"]
    fence.lost, steps[:] = True, []
    with pytest.raises(LeaseLost):
        out.commit_part("a.jsonl", 2, lines(2, 4), ok_counts(2))
    assert steps == ["reserve", "fence", "release"]
    assert committed(out.fs, out.parts_dir("a.jsonl")).lines == 2  # nothing more written
