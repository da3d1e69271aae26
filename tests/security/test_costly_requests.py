"""Issue 42's attacks on the cost of a request, through the real doors (a grpc.aio server with
real stubs, an aiohttp app with real bodies: tests/support/doors.py) over a model that makes
the work as large as a caller can (tests/support/costmodels.py):

- a `:segment` on a 4000x3000 image to a Mask R-CNN-layout model that returns 100 whole-image
  instances (55 s of CPU and a 12 MB answer per request before): the masks past the model's
  max_mask_pixels (default 12 M: one such mask) are left out and the answer says so; a
  first mask alone over the limit, or a max_detections over the ceiling, is refused
  (RESOURCE_EXHAUSTED / 413) naming the setting;
- the same with a short deadline (the slot was freed at the deadline while pasting ran on):
  DEADLINE_EXCEEDED, the work stops, and the caller's slot is held until it has;
- a shadow rollout on a detector giving 1000 boxes (6.9 s of O(n*m) Python on the event
  loop before): compared in a thread of its own, every pair matched.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import pytest

from gateway.proto.detection.v1 import detection_pb2 as dpb
from gateway.proto.detection.v1 import detection_pb2_grpc as dpb_grpc
from gateway.proto.segmentation.v1 import segmentation_pb2 as pb
from gateway.proto.segmentation.v1 import segmentation_pb2_grpc as pb_grpc
from tests.support import costmodels
from tests.support.doors import InProcessDoors
from tests.support.httpcalls import call
from tests.support.waiting import wait_for

BIG = costmodels.png(4000, 3000)  # 12 megapixels in ~40 KB


def segment(
    doors: InProcessDoors, timeout: float = 60.0, **options: object
) -> pb.SegmentationResult:
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.SegmentationServiceStub(channel)
        request = pb.SegmentRequest(image=BIG, **options)  # type: ignore[arg-type]
        request.model.name = "segmenter"
        return stub.Segment(request, timeout=timeout)


def doors(tmp_path: Path, segmenter: str = "", **settings: object) -> InProcessDoors:
    config = costmodels.write_model_config(tmp_path, segmenter=segmenter)
    models = [costmodels.segmenter(), costmodels.boxes()]
    return InProcessDoors(models, model_config=str(config), model="segmenter", **settings)


def test_a_worst_case_segmentation_is_cut_at_the_mask_pixel_limit_and_says_so(tmp_path):
    with doors(tmp_path) as gateway:
        result = segment(gateway)
        # 12 M mask pixels hold one 4000x3000 mask: the best instance, the rest left out.
        assert [round(i.score, 2) for i in result.instances] == [0.99]
        assert result.truncated.instances_left_out == 99
        assert result.truncated.limit == "max_mask_pixels"
        assert "GATEWAY_MAX_MASK_PIXELS" in result.truncated.message
        # The HTTP door, a raw PNG body: the same cut in the JSON answer.
        status, _, body = call(gateway, "/v1/models/segmenter:segment", BIG, "image/png")  # type: ignore[arg-type]
        assert status == 200, body
        answer = json.loads(body)
        assert len(answer["instances"]) == 1
        assert answer["truncated"]["instances_left_out"] == 99
        assert answer["truncated"]["limit"] == "max_mask_pixels"
        # As polygons, tracing the outlines is priced too (each edge as 100 mask pixels):
        # the one mask that fits as RLE does not as polygons, and the refusal says what to ask.
        status, _, body = call(
            gateway, "/v1/models/segmenter:segment?mask_format=polygon", BIG, "image/png"
        )  # type: ignore[arg-type]
        assert status == 413, body
        error = json.loads(body)["error"]
        assert (
            error["code"] == "RESOURCE_EXHAUSTED" and "ask for mask_format rle" in error["message"]
        )
        assert "GATEWAY_MAX_MASK_PIXELS" in error["message"]


def test_the_answer_bytes_limit_cuts_too(tmp_path):
    limits = "[models.segmenter.limits]\nmax_mask_pixels = 2000000000\nmax_answer_bytes = 300000"
    with doors(tmp_path, limits) as gateway:
        result = segment(gateway, max_detections=5, mask_format="png")
        assert 1 <= len(result.instances) < 5
        assert sum(len(i.mask.png) for i in result.instances) <= 300_000
        assert result.truncated.limit == "max_answer_bytes"
        assert result.truncated.instances_left_out == 5 - len(result.instances)
        assert "models.segmenter.limits.max_answer_bytes" in result.truncated.message


def test_work_over_a_ceiling_is_refused_naming_the_setting(tmp_path):
    with doors(tmp_path, "[models.segmenter.limits]\nmax_mask_pixels = 1000") as gateway:
        with pytest.raises(grpc.RpcError) as info:
            segment(gateway)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "models.segmenter.limits.max_mask_pixels" in str(info.value.details())
        status, _, body = call(gateway, "/v1/models/segmenter:segment", BIG, "image/png")  # type: ignore[arg-type]
        assert status == 413, body
        assert json.loads(body)["error"]["code"] == "RESOURCE_EXHAUSTED"
        # A caller cannot raise the detections ceiling (default 1000).
        with pytest.raises(grpc.RpcError) as info:
            segment(gateway, max_detections=5000)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "GATEWAY_MAX_DETECTIONS_LIMIT" in str(info.value.details())
        status, _, body = call(
            gateway, "/v1/models/boxes:detect?max_detections=1001", BIG, "image/png"
        )  # type: ignore[arg-type]
        assert status == 413 and b"over model 'boxes''s limit of 1000" in body, body


def _thread_cpu(prefix: str) -> float:
    """CPU seconds the gateway's threads named `prefix`... have used (Linux /proc)."""
    total = 0.0
    ticks = 100.0
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread.native_id is not None:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)
            parts = fields[1].split()
            total += (int(parts[11]) + int(parts[12])) / ticks
    return total


def test_a_deadline_stops_the_work_and_holds_the_slot_until_it_has(tmp_path):
    # Without the mask limit this request pastes 100 x 12 M pixels: tens of seconds of CPU.
    with doors(tmp_path, "[models.segmenter.limits]\nmax_mask_pixels = 2000000000") as gateway:
        seen: list[int] = []  # requests in flight while the map thread still works
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            segment(gateway, timeout=1.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 5
        # The slot is held while the work stops, then freed; the work does not go on.
        wait_for(lambda: gateway.pipeline.in_flight == 0, "the slot freed", timeout=5)
        seen.append(gateway.pipeline.in_flight)
        before = _thread_cpu("map")
        time.sleep(0.5)
        assert _thread_cpu("map") - before < 0.1
        assert seen == [0]


def test_a_thousand_box_shadow_is_compared_off_the_event_loop(tmp_path):
    rollout = "[models.boxes.rollout]\nshadow = { version = 2, share = 1.0 }\n"
    config = costmodels.write_model_config(tmp_path, boxes=rollout)
    # The in-process TF Serving answers every version of a name alike: the candidate (version
    # 2) gives the same 1000 boxes, so every pair matches.
    models = [costmodels.segmenter(), costmodels.boxes(1000)]
    with InProcessDoors(models, model_config=str(config), model="boxes") as gateway:
        with grpc.insecure_channel(gateway.grpc_target) as channel:
            stub = dpb_grpc.DetectionServiceStub(channel)
            result = stub.Detect(dpb.DetectRequest(image=BIG, max_detections=1000), timeout=60)
        assert len(result.detections) == 1000
        gateway.call(gateway.pipeline.shadows.drain())
        summary = gateway.pipeline.rollouts.summary("boxes")
        assert summary is not None
        assert summary["shadow"]["detection"]["images"] == 1
        assert summary["shadow"]["detection"]["matched_pairs"] == 1000
        assert summary["shadow"]["detection"]["precision"] == 1.0
