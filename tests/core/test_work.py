"""A call's Account: one admission, every image charged before it runs, all of it given back
(what was not used returned to the caller's work bucket) when the call is done."""

from __future__ import annotations

import pytest

from gateway.core.work import Account
from gateway.domain import Cost, Work
from gateway.errors import GatewayError, Kind
from gateway.policy.fairshare import FairShare
from gateway.policy.quotas import parse

CALLER = "uri:spiffe://cluster.local/ns/a/sa/b"


def share(text: str = "[default]\nwork_concurrency = 10\n") -> FairShare:
    return FairShare(8, parse(text, "q.toml"))


def test_a_tree_of_images_holds_one_slot_and_the_sum_of_its_work():
    limit = share()
    account = Account(limit, CALLER)
    works = [Work() for _ in range(3)]
    for work in works:
        account.charge(Cost(pixels=2_000_000), work)
    assert (limit.in_flight, limit.work_in_flight) == (1, pytest.approx(6.0))
    account.release()
    assert (limit.in_flight, limit.work_in_flight, limit.working) == (0, 0.0, 0)


def test_an_image_over_the_caller_s_work_in_flight_is_refused_and_takes_nothing():
    limit = share()
    account = Account(limit, CALLER)
    account.charge(Cost(pixels=6_000_000), Work())
    with pytest.raises(GatewayError) as refused:
        account.charge(Cost(pixels=6_000_000), Work())  # 12 units: over 10
    assert refused.value.kind is Kind.OVERLOADED
    assert limit.work_in_flight == pytest.approx(6.0)
    account.release()
    assert (limit.in_flight, limit.work_in_flight) == (0, 0.0)


def test_what_an_image_did_not_use_goes_back_to_the_caller_s_bucket():
    limit = share("[default]\nwork_rate = 0.001\nwork_burst = 10\n")
    account = Account(limit, CALLER)
    work = Work()
    account.charge(Cost(pixels=1_000_000, mask_pixels=4_000_000), work)
    work.mask_pixels = 1_000_000  # it pasted a quarter of the masks it was priced for
    account.release()
    # 5 units reserved, 2 used: 8 of the burst's 10 are left, so 8 fit and 9 do not.
    again = Account(limit, CALLER)
    again.charge(Cost(pixels=8_000_000), Work())
    again.release()
    last = Account(limit, CALLER)
    with pytest.raises(GatewayError):
        last.charge(Cost(pixels=1_000_000), Work())
    last.release()
