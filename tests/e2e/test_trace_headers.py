"""Trace context and request ids across the gateway: what a caller sends reaches TF Serving,
and every answer (result, trailer, abort) names the request.

A real gateway process calls tests/support/faultupstream.py, which records the metadata of
every call it receives and forwards to a real local TF Serving.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
# One of each header family the gateway passes on (Istio's list: W3C, B3 multi and single,
# Envoy's request id).
TRACE = (
    ("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01"),
    ("tracestate", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
    ("x-request-id", "req-7d1c"),
    ("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7"),
    ("x-b3-spanid", "e457b5a2e4d86bd1"),
    ("x-b3-parentspanid", "05e3ac9a4f6e3b90"),
    ("x-b3-sampled", "1"),
    ("x-b3-flags", "0"),
    ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90"),
)
# Not a trace header: must not be passed on.
PRIVATE = ("authorization", "Bearer secret-token")


@pytest.fixture(scope="module")
def upstream(tfs_ops: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(tfs_ops.target) as faulty:
        yield faulty


@pytest.fixture(scope="module")
def gateway(
    upstream: FaultyUpstream, gateway_model_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    args = [f"--model-config={gateway_model_config}"]
    with run_gateway(upstream.target, args, log_dir=tmp_path_factory.mktemp("trace")) as gw:
        yield gw


@pytest.fixture(scope="module")
def scene() -> tuple[bytes, int]:
    generated = scenes.generate_scene(np.random.default_rng(11), 160, 120, 2)
    return scenes.encode(generated.pixels, "PNG"), len(generated.boxes)


def predicts_since(upstream: FaultyUpstream, count: int) -> list[dict[str, str]]:
    return upstream.metadata_of("Predict")[count:]


def assert_carries_trace(metadata: dict[str, str]) -> None:
    for key, value in TRACE:
        assert metadata.get(key) == value, (key, metadata)
    assert PRIVATE[0] not in metadata


def test_detect_passes_every_trace_header_to_tf_serving_and_logs_the_trace_id(
    gateway: GatewayProcess, upstream: FaultyUpstream, scene: tuple[bytes, int]
) -> None:
    before = len(upstream.metadata_of("Predict"))
    with gateway.channel() as channel:
        result, call = gateway.stub(channel).Detect.with_call(
            pb.DetectRequest(image=scene[0]), metadata=(*TRACE, PRIVATE), timeout=60
        )
    assert len(result.detections) == scene[1]
    [sent] = predicts_since(upstream, before)
    assert_carries_trace(sent)
    assert result.request_id == "req-7d1c"
    assert ("x-request-id", "req-7d1c") in call.trailing_metadata()
    [record] = [r for r in gateway.records() if r.get("request_id") == "req-7d1c"]
    assert record["trace_id"] == TRACE_ID and record["code"] == "OK"


def test_detect_stream_passes_the_trace_headers_with_every_frame(
    gateway: GatewayProcess, upstream: FaultyUpstream, scene: tuple[bytes, int]
) -> None:
    before = len(upstream.metadata_of("Predict"))
    frames = [pb.DetectRequest(image=scene[0]) for _ in range(3)]
    with gateway.channel() as channel:
        call = gateway.stub(channel).DetectStream(
            iter(frames), metadata=(*TRACE, PRIVATE), timeout=60
        )
        results = list(call)
        trailer = call.trailing_metadata()
    assert [len(r.detections) for r in results] == [scene[1]] * 3
    assert [r.request_id for r in results] == ["req-7d1c-0", "req-7d1c-1", "req-7d1c-2"]
    assert ("x-request-id", "req-7d1c") in trailer
    sent = predicts_since(upstream, before)
    assert len(sent) == 3
    for metadata in sent:
        assert_carries_trace(metadata)


def test_classify_passes_the_trace_headers_to_tf_serving(
    gateway: GatewayProcess, upstream: FaultyUpstream
) -> None:
    red = np.zeros((40, 60, 3), np.uint8)
    red[..., 0] = 255
    before = len(upstream.metadata_of("Predict"))
    with gateway.channel() as channel:
        stub = cpb_grpc.ClassificationServiceStub(channel)
        result = stub.Classify(
            cpb.ClassifyRequest(image=scenes.encode(red, "PNG")),
            metadata=(*TRACE, PRIVATE),
            timeout=60,
        )
    assert result.classes[0].label == "red" and result.classes[0].score > 0.99
    assert result.request_id == "req-7d1c"
    [sent] = predicts_since(upstream, before)
    assert_carries_trace(sent)


def test_no_trace_headers_in_means_none_out(
    gateway: GatewayProcess, upstream: FaultyUpstream, scene: tuple[bytes, int]
) -> None:
    before = len(upstream.metadata_of("Predict"))
    with gateway.channel() as channel:
        gateway.stub(channel).Detect(pb.DetectRequest(image=scene[0]), timeout=60)
    [sent] = predicts_since(upstream, before)
    assert not {key for key, _ in TRACE} & set(sent)


# --- x-request-id in and out ---------------------------------------------------------------


def test_request_id_from_the_header_comes_back_in_the_result_and_the_trailer(
    gateway: GatewayProcess, scene: tuple[bytes, int]
) -> None:
    with gateway.channel() as channel:
        stub = gateway.stub(channel)
        result, call = stub.Detect.with_call(
            pb.DetectRequest(image=scene[0]), metadata=[("x-request-id", "from-header")], timeout=60
        )
        assert result.request_id == "from-header"
        assert ("x-request-id", "from-header") in call.trailing_metadata()
        # The request's own field wins over the header.
        result, call = stub.Detect.with_call(
            pb.DetectRequest(image=scene[0], request_id="from-field"),
            metadata=[("x-request-id", "from-header")],
            timeout=60,
        )
        assert result.request_id == "from-field"
        assert ("x-request-id", "from-field") in call.trailing_metadata()
        # Neither: the gateway makes one up and says which.
        result, call = stub.Detect.with_call(pb.DetectRequest(image=scene[0]), timeout=60)
    assert re.fullmatch(r"[0-9a-f]{32}", result.request_id)
    assert ("x-request-id", result.request_id) in call.trailing_metadata()


def test_a_failed_detect_carries_its_request_id_in_the_trailer(gateway: GatewayProcess) -> None:
    with gateway.channel() as channel, pytest.raises(grpc.RpcError) as info:
        gateway.stub(channel).Detect(
            pb.DetectRequest(image=b"not an image"),
            metadata=[("x-request-id", "bad-1")],
            timeout=60,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("x-request-id", "bad-1") in info.value.trailing_metadata()


@pytest.mark.parametrize("header", [True, False], ids=["header", "generated"])
def test_an_aborted_detect_stream_carries_its_request_id_in_the_trailer(
    gateway: GatewayProcess, scene: tuple[bytes, int], header: bool
) -> None:
    """A model TF Serving does not have ends the whole stream (NOT_FOUND); the trailer
    still names the stream, as Detect's does."""
    frames = [pb.DetectRequest(image=scene[0], model=model_pb2.ModelSpec(name="no-such-model"))]
    metadata = [("x-request-id", "stream-9")] if header else []
    with gateway.channel() as channel:
        call = gateway.stub(channel).DetectStream(iter(frames), metadata=metadata, timeout=60)
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    trailer = dict(info.value.trailing_metadata())
    if header:
        assert trailer["x-request-id"] == "stream-9"
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", trailer["x-request-id"])
        records = [r for r in gateway.records() if r.get("code") == "NOT_FOUND"]
        assert f"{trailer['x-request-id']}-0" in {r["request_id"] for r in records}
