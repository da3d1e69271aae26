"""Leases in the job store (gateway.jobs.control.leases): one holder at a time, also when processes
race for the same generation; renewal, release, expiry, a lost lease."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

from gateway.jobs.control.leases import Leases
from gateway.jobs.control.store import JobStore


def leases(tmp_path: Path, holder: str, seconds: float = 30.0) -> Leases:
    return Leases(JobStore(str(tmp_path / "store")), holder, seconds)


def test_one_holder_at_a_time_and_renewal_keeps_it(tmp_path: Path) -> None:
    a, b = leases(tmp_path, "a"), leases(tmp_path, "b")
    first = a.acquire("job1")
    assert first is not None and first.holder == "a" and first.live()
    assert b.acquire("job1") is None and b.held_elsewhere("job1")
    assert not a.held_elsewhere("job1")
    again = a.acquire("job1")  # the holder taking it again renews it
    assert again is not None and again.generation == first.generation + 1
    renewed = a.renew(again)
    assert renewed is not None and renewed.generation == again.generation + 1
    assert b.acquire("job1") is None
    # One file per lease, replaced by conditional write.
    files = sorted(p.name for p in (tmp_path / "store" / "leases").iterdir())
    assert files == [".lock", "job1.json"]


def test_released_or_expired_leases_are_taken_and_the_old_holder_loses(tmp_path: Path) -> None:
    a, b = leases(tmp_path, "a", seconds=0.2), leases(tmp_path, "b", seconds=0.2)
    held = a.acquire("job1")
    assert held is not None
    a.release(held)
    taken = b.acquire("job1")
    assert taken is not None and taken.holder == "b"
    assert a.renew(held) is None  # a renewal of an old generation fails: the lease is lost
    deadline = time.monotonic() + 10
    while b.current("job1").live():  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert a.acquire("job1") is not None  # b stopped renewing: its lease expired
    assert b.renew(taken) is None


def test_racing_processes_get_one_lease(tmp_path: Path) -> None:
    contenders = [leases(tmp_path, f"p{i}") for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda lease: lease.acquire("job1"), contenders))
    winners = [g for g in got if g is not None]
    assert len(winners) == 1
    current = contenders[0].current("job1")
    assert current is not None and current.holder == winners[0].holder
    leftovers = [p.name for p in (tmp_path / "store" / "leases").iterdir()]
    assert not [n for n in leftovers if n.startswith(".tmp-")]


def test_remove_forgets_and_names_lists(tmp_path: Path) -> None:
    a = leases(tmp_path, "a")
    assert a.acquire("job1") is not None and a.acquire("job2") is not None
    assert a.names() == ["job1", "job2"]
    a.remove("job1")
    assert a.names() == ["job2"] and a.current("job1") is None


def test_a_stalled_holder_cannot_renew_after_another_took_over_and_renewed(
    tmp_path: Path,
) -> None:
    """The ABA sequence: a holds the lease and stalls past it; b takes it and renews twice;
    a's renewal, and its fence, fail (no version comes back)."""
    a, b = leases(tmp_path, "a", seconds=0.05), leases(tmp_path, "b", seconds=30)
    held = a.acquire("job1")
    assert held is not None and held.holder == "a"
    deadline = time.monotonic() + 10
    while held.live():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    taken = b.acquire("job1")
    assert taken is not None
    for _ in range(2):
        taken = b.renew(taken)
        assert taken is not None
    assert not a.holds(held)
    assert a.renew(held) is None and a.acquire("job1") is None
    assert b.holds(taken) and b.current("job1") == taken
    # Removed and taken again from scratch: the old holders' versions still fail.
    assert b.remove("job1", taken)
    again = a.acquire("job1")
    assert again is not None and again.generation == 1
    assert b.renew(taken) is None and a.renew(held) is None
