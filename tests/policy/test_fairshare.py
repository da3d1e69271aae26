"""Admission per caller on a clock the test moves: quotas (rate, burst, concurrency), the fair
share at the gateway's limit, retry delays, metrics labels and forgotten callers."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from gateway.errors import GatewayError, Kind
from gateway.policy.fairshare import INTERNAL, FairShare
from gateway.policy.quotas import parse

BURSTER, STEADY = "uri:spiffe://test.local/sa/burster", "uri:spiffe://test.local/sa/steady"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(share: FairShare, caller: str) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        share.acquire(caller)
    assert info.value.kind is Kind.OVERLOADED
    return info.value


def sample(caller: str, decision: str) -> float:
    value = REGISTRY.get_sample_value(
        "vision_gateway_caller_requests_total", {"caller": caller, "decision": decision}
    )
    return value or 0.0


def test_a_caller_over_its_rate_is_refused_with_the_time_to_its_next_token() -> None:
    clock = Clock()
    quotas = parse(f'[callers."{BURSTER}"]\nrate = 4\nburst = 2\n', "q.toml")
    share = FairShare(64, quotas, clock)
    for _ in range(2):  # the burst
        share.release(share.acquire(BURSTER), 0.01)
    error = refused(share, BURSTER)
    assert error.retry_after == pytest.approx(0.25)
    assert "over its rate of 4 requests per second (burst 2" in error.message
    assert f'[callers."{BURSTER}"] of the quota file' in error.message
    clock.now += 0.1
    assert refused(share, BURSTER).retry_after == pytest.approx(0.15)
    clock.now += 0.15
    share.release(share.acquire(BURSTER), 0.01)  # a token again
    share.acquire(STEADY)  # another caller: no quota, not touched


def test_a_caller_at_its_concurrency_waits_for_an_answer() -> None:
    share = FairShare(64, parse("[default]\nconcurrency = 2\n", "q.toml"), Clock())
    first, _ = share.acquire(BURSTER), share.acquire(BURSTER)
    error = refused(share, BURSTER)
    assert "has 2 images in flight, its limit ([default] of the quota file)" in error.message
    assert error.retry_after is not None and error.retry_after > 0
    share.acquire(STEADY)
    share.release(first, 0.01)
    share.acquire(BURSTER)


def test_at_the_limit_only_callers_above_their_fair_share_are_refused() -> None:
    share = FairShare(4, clock=Clock())
    tickets = [share.acquire(BURSTER) for _ in range(4)]  # alone, it may take the whole limit
    error = refused(share, BURSTER)
    assert "limit of 4 images and caller " + BURSTER + " holds 4, at or above" in error.message
    assert "callers active" not in error.message and "share of 4" not in error.message
    # A second caller is within its share (4 / 2 callers): it goes in, past the limit ...
    steady = [share.acquire(STEADY), share.acquire(STEADY)]
    assert share.in_flight == 6
    refused(share, STEADY)  # ... up to its share, no further
    share.release(tickets.pop(), 0.01)
    refused(share, BURSTER)  # still at the limit and above its share: refused
    for ticket in tickets:
        share.release(ticket, 0.01)
    assert share.in_flight == 2
    share.acquire(BURSTER)  # below the limit, anyone goes on
    share.acquire(BURSTER)
    for ticket in steady:
        share.release(ticket, 0.01)
    assert share.active == 1


def test_the_gateways_own_work_has_no_quota_but_a_fair_share() -> None:
    share = FairShare(2, parse("[default]\nrate = 1\nburst = 1\n", "q.toml"), Clock())
    share.acquire(INTERNAL)
    share.acquire(INTERNAL)
    error = refused(share, INTERNAL)
    assert "the gateway's own batch work holds 2" in error.message
    share.acquire(STEADY)  # within its share while batch work holds the limit


def test_metrics_fold_callers_the_file_does_not_name_into_other() -> None:
    quotas = parse(f'[callers."{STEADY}"]\nrate = 1000\n[default]\nrate = 1\n', "q.toml")
    share = FairShare(64, quotas, Clock())
    before = sample(STEADY, "admitted"), sample("other", "admitted"), sample("other", "rate")
    share.acquire(STEADY)
    for n in range(3):
        share.acquire(f"spiffe://test.local/sa/stranger-{n}")
    refused(share, "spiffe://test.local/sa/stranger-0")
    after = sample(STEADY, "admitted"), sample("other", "admitted"), sample("other", "rate")
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 3, 1]
    assert REGISTRY.get_sample_value(
        "vision_gateway_caller_in_flight_requests", {"caller": "other"}
    ) == pytest.approx(3.0, abs=64)  # other tests share the process's gauge


def test_callers_seen_once_are_forgotten_once_their_bucket_is_full_again() -> None:
    clock = Clock()
    share = FairShare(64, parse("[default]\nrate = 100\n", "q.toml"), clock)
    for n in range(5000):  # each used a token: their buckets are not full, all are kept
        share.release(share.acquire(f"caller-{n}"), 0.001)
    assert share.callers == 5000
    clock.now += 10  # their buckets are full again: the next sweep drops them
    for n in range(3500):
        share.release(share.acquire(f"again-{n}"), 0.001)
    assert share.callers == 3500


def test_past_its_ceiling_new_callers_share_one_overflow_entry_per_table() -> None:
    """100k identities cannot make the table hold 100k entries: past --max-callers the new
    ones share their table's entry (its rate and concurrency count for all of them), while
    callers the file names exactly keep their own."""
    clock = Clock()
    quotas = parse(f'[callers."{STEADY}"]\nrate = 10\n[default]\nrate = 5\n', "q.toml")
    share = FairShare(64, quotas, clock, max_callers=100)
    for n in range(100_000):
        ticket = share.acquire(f"uri:spiffe://flood/{n}") if n < 100 else None
        if ticket is not None:
            share.release(ticket, 0.001)
        elif n < 105:  # the overflow entry has the [default] table's 5 tokens, for all
            share.release(share.acquire(f"uri:spiffe://flood/{n}"), 0.001)
        else:
            refused(share, f"uri:spiffe://flood/{n}")
    assert share.callers <= 101
    for _ in range(10):  # a caller the file names keeps its own entry and rate
        share.release(share.acquire(STEADY), 0.001)
    clock.now += 10  # buckets are full again: the next sweep makes room for new callers
    share.release(share.acquire("uri:spiffe://late"), 0.001)
    assert share.callers <= 100 and share.acquire("uri:spiffe://late").identity == (
        "uri:spiffe://late"
    )
