"""Fair shares counted in work (gateway.domain.Cost units: megapixels decoded or pasted,
megabytes of answer), on a clock the test moves: a caller's work_rate bucket and
work_concurrency, its fair share of --max-concurrent-work, what is not spent going back, and
the figure per caller in the metrics. Through the doors: a heavy caller at its work rate is
refused while a light one goes on."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from gateway.domain import Cost
from gateway.errors import GatewayError, Kind
from gateway.policy.fairshare import FairShare
from gateway.policy.quotas import QuotaError, parse
from gateway.proto.segmentation.v1 import segmentation_pb2 as pb
from gateway.proto.segmentation.v1 import segmentation_pb2_grpc as pb_grpc
from tests.support import costmodels
from tests.support.doors import InProcessDoors

HEAVY, LIGHT = "uri:spiffe://test.local/sa/heavy", "uri:spiffe://test.local/sa/light"
MASKS = Cost(pixels=1_000_000, mask_pixels=11_000_000, answer_bytes=0)  # 12 units
DETECT = Cost(pixels=300_000)  # 0.3 units


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def charged(share: FairShare, caller: str, cost: Cost) -> object:
    ticket = share.acquire(caller)
    try:
        share.charge(ticket, cost)
    except GatewayError:
        share.release(ticket, 0.01)
        raise
    return ticket


def refusal(share: FairShare, caller: str, cost: Cost) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        charged(share, caller, cost)
    assert info.value.kind is Kind.OVERLOADED
    return info.value


def units(caller: str) -> float:
    value = REGISTRY.get_sample_value("vision_gateway_caller_work_units_total", {"caller": caller})
    return value or 0.0


def test_a_heavy_caller_pays_its_work_rate_and_a_light_one_is_untouched() -> None:
    clock = Clock()
    quotas = parse(f'[callers."{HEAVY}"]\nwork_rate = 6\nwork_burst = 12\n', "q.toml")
    share = FairShare(64, quotas, clock)
    before = units(HEAVY)
    share.release(charged(share, HEAVY, MASKS), 0.5, MASKS, MASKS)  # the whole bucket
    assert units(HEAVY) - before == pytest.approx(12.0)
    error = refusal(share, HEAVY, MASKS)
    assert "over its work rate of 6 work units per second (this image: 12" in error.message
    assert error.retry_after == pytest.approx(2.0)  # 12 units at 6 per second
    for _ in range(50):  # the light caller has no work quota: never refused
        ticket = charged(share, LIGHT, DETECT)
        share.release(ticket, 0.01, DETECT, DETECT)
    clock.now += 2.0
    share.release(charged(share, HEAVY, MASKS), 0.5, MASKS, DETECT)  # used 0.3 of 12
    # What it did not use came back: 11.7 units in the bucket, not enough for 12 yet ...
    assert refusal(share, HEAVY, MASKS).retry_after == pytest.approx(0.05)
    clock.now += 0.06
    charged(share, HEAVY, MASKS)  # ... and then it is


def test_a_request_alone_may_be_larger_than_the_quota_and_the_debt_is_paid_back() -> None:
    clock = Clock()
    share = FairShare(
        64, parse("[default]\nwork_rate = 1\nwork_concurrency = 4\n", "q.toml"), clock
    )
    first = charged(share, HEAVY, MASKS)  # 12 units, over both: alone, it goes in
    error = refusal(share, HEAVY, DETECT)
    assert "has 12 work units in flight and this image needs 0.3 more" in error.message
    share.release(first, 1.0, MASKS, MASKS)
    assert refusal(share, HEAVY, DETECT).retry_after == pytest.approx(10.0, rel=0.01)


def test_at_the_work_limit_only_callers_within_their_share_go_in() -> None:
    share = FairShare(64, max_work=20.0, clock=Clock())
    held = [charged(share, HEAVY, MASKS), charged(share, HEAVY, MASKS)]  # 24 of 20
    error = refusal(share, HEAVY, DETECT)
    assert "at its limit of work in flight" in error.message
    charged(share, LIGHT, DETECT)  # another caller, below its share (10): in
    share.release(held[0], 0.1, MASKS, MASKS)
    charged(share, HEAVY, DETECT)  # back under the limit


def test_work_keys_are_checked() -> None:
    with pytest.raises(QuotaError, match="work_burst needs a work_rate"):
        parse("[default]\nwork_burst = 4\n", "q.toml")
    with pytest.raises(QuotaError, match="work_concurrency must be a number > 0"):
        parse("[default]\nwork_concurrency = -1\n", "q.toml")


def test_through_the_doors_a_caller_over_its_work_rate_is_refused(tmp_path: Path) -> None:
    quotas = tmp_path / "quotas.toml"
    quotas.write_text("[default]\nwork_rate = 0.01\nwork_burst = 30\n")
    config = costmodels.write_model_config(tmp_path)
    models = [costmodels.segmenter(), costmodels.boxes(3)]
    image = costmodels.png(2000, 1500)  # 3 MP: 3 decoded + 12 M mask pixels + masks: ~16 units
    with InProcessDoors(
        models, model_config=str(config), model="segmenter", quotas=str(quotas)
    ) as doors:
        with grpc.insecure_channel(doors.grpc_target) as channel:
            stub = pb_grpc.SegmentationServiceStub(channel)
            request = pb.SegmentRequest(image=image, max_detections=4)
            stub.Segment(request, timeout=60)  # 3 + 4 x 3 M mask pixels + answer: ~16 units
            with pytest.raises(grpc.RpcError) as info:
                stub.Segment(request, timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over its work rate of 0.01 work units per second" in str(info.value.details())
        assert units("other") >= 15
