"""DetectStream through the whole path (conftest.py): results in request order, read-side
back-pressure (a client that reads no results stops the gateway taking frames), a bad frame's
own error, a stream-wide failure."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from tests.support.detections import STREAM_WINDOW, assert_matches, scene_for, sent_size
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess


def test_stream_results_come_back_in_request_order(stub):
    frames = [scene_for(60 + i, 320, 240, i % 7) for i in range(12)]
    requests = (
        pb.DetectRequest(image=scenes.encode(f.pixels, "PNG"), request_id=f"frame-{i}")
        for i, f in enumerate(frames)
    )
    results = list(stub.DetectStream(requests, timeout=120))
    assert [r.request_id for r in results] == [f"frame-{i}" for i in range(12)]
    for result, frame in zip(results, frames, strict=True):
        assert_matches(result, frame)


def test_stream_stops_reading_frames_while_the_client_does_not_read_results(windowed, recording):
    # Read-side back-pressure: a client that sends frames as fast as gRPC takes them but
    # reads no results. The gateway answers its window of frames; gRPC sends results until
    # the client's HTTP/2 flow-control window is full; then the gateway's next result waits,
    # and it must stop taking frames. Frames accepted (one Predict upstream each) must stay
    # within what that window holds plus the gateway's window, far below what is offered.
    # The client keeps HTTP/2's default 64 KiB window: with BDP probing (gRPC's default)
    # its window grows while it does not read, and buffers hundreds of small results.
    scene = scene_for(70, 320, 240, 12, noise=0)
    frame = scenes.encode(scene.pixels, "PNG")
    probe = scenes.encode(scene_for(71, 64, 48, 1, noise=0).pixels, "PNG")
    offered = 240
    before = len(recording.predicts)

    def frames() -> int:
        """Frames of the stream that reached TF Serving (the probes are smaller)."""
        return sum(sent_size(r) == (320, 240) for r in recording.predicts[before:])

    handed = 0  # frames the client's gRPC has taken from the generator to send

    def requests() -> Iterator[pb.DetectRequest]:
        nonlocal handed
        for i in range(offered):
            handed += 1
            yield pb.DetectRequest(image=frame, request_id=str(i))

    options = [*CHANNEL_OPTIONS, ("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(windowed.target, options=options) as channel:
        results = windowed.stub(channel).DetectStream(requests(), timeout=600)
        # Nothing reads `results` yet.
        accepted = _stopped_taking_frames(frames, windowed, probe, lambda: handed)
        # The client reads: the gateway takes the rest; every result arrives, in order.
        got = list(results)
    assert [r.request_id for r in got] == [str(i) for i in range(offered)]
    assert frames() == offered
    # Each result takes its size plus gRPC's 5-byte message prefix of the 65,535-byte window.
    buffered = 65_535 // (got[0].ByteSize() + 5)
    assert STREAM_WINDOW < accepted <= buffered + STREAM_WINDOW + 2 < offered, (accepted, buffered)


def _stopped_taking_frames(
    frames: Callable[[], int],
    gateway: GatewayProcess,
    probe: bytes,
    handed: Callable[[], int],
    rounds: int = 2,
) -> int:
    """`frames()` once the gateway has stopped taking frames: nothing in flight, and the count
    (above 0) the same before and after each of `rounds` rounds of unary Detects (`probe`) that
    the gateway answered on another connection meanwhile, while the client had handed gRPC
    more frames than that (`handed()`: frames offered, not a client that fell behind). Its event
    loop reads the stream's frames too: a gateway that could take another frame would have
    taken it while it served them."""
    deadline = time.monotonic() + 120
    last, stable = -1, -1
    with gateway.channel() as channel:
        stub = gateway.stub(channel)
        while stable < rounds:
            while gateway.in_flight() != 0:
                assert time.monotonic() < deadline, "the gateway kept frames in flight"
                time.sleep(0.02)
            now = frames()
            offering = handed() > now
            stable = stable + 1 if now == last and now > 0 and offering else 0
            assert time.monotonic() < deadline, f"the gateway kept taking frames: {now} accepted"
            last = now
            for _ in range(3):
                stub.Detect(pb.DetectRequest(image=probe), timeout=60)
    return last


def test_a_bad_frame_gets_its_own_error_and_the_stream_goes_on(stub):
    good = scenes.encode(scene_for(80).pixels, "PNG")
    huge = scenes.encode(scene_for(80).pixels, "PNG")[:16] + b"\x00" * 8  # header only
    requests = [pb.DetectRequest(image=good, request_id=str(i)) for i in range(3)]
    requests.append(pb.DetectRequest(image=b"not an image", request_id="bad"))
    requests.append(pb.DetectRequest(image=good, min_score=2.0, request_id="bad-option"))
    requests.append(pb.DetectRequest(image=huge, request_id="truncated"))
    requests.append(pb.DetectRequest(image=good, request_id="after"))
    results = list(stub.DetectStream(iter(requests), timeout=60))
    assert [r.request_id for r in results] == [
        "0",
        "1",
        "2",
        "bad",
        "bad-option",
        "truncated",
        "after",
    ]
    for r in (results[0], results[1], results[2], results[6]):
        assert not r.HasField("error") and r.model.name == "detector" and r.detections
    for r in results[3:6]:
        assert r.HasField("error") and not r.detections and not r.HasField("model")
        assert r.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "could not be decoded as any supported format" in results[3].error.message
    assert "min_score must be in [0, 1]" in results[4].error.message
    assert "looks like PNG but could not be decoded" in results[5].error.message


def test_a_stream_wide_failure_ends_the_stream_after_earlier_results(stub):
    good = scenes.encode(scene_for(80).pixels, "PNG")
    requests = [pb.DetectRequest(image=good, request_id=str(i)) for i in range(2)]
    requests.append(
        pb.DetectRequest(
            image=good, model=model_pb2.ModelSpec(name="no_such_model"), request_id="x"
        )
    )
    requests.append(pb.DetectRequest(image=good, request_id="after"))
    received = []
    with pytest.raises(grpc.RpcError) as info:
        for result in stub.DetectStream(iter(requests), timeout=60):
            received.append(result.request_id)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert received == ["0", "1"]
    trailers = dict(info.value.trailing_metadata() or ())
    assert trailers.get("x-request-id")
