"""The gateway's error table through the whole path (conftest.py): empty, undecodable,
truncated and oversized images, unknown models, versions and labels, out-of-range fields, a
model no task can use, the caller's deadline passed on to TF Serving, TF Serving unreachable."""

from __future__ import annotations

import time

import grpc
import pytest
from PIL import Image

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from tests.support.detections import (
    MAX_IMAGE_BYTES,
    MODELS,
    assert_matches,
    detect,
    encode,
    log_lines,
    model,
    rpc_error,
    scene_for,
)
from tests.support.gatewayproc import run_gateway
from tests.support.localserver import closed_port

# --- the error table -------------------------------------------------------------------


def test_empty_image_is_invalid_argument(stub):
    error = rpc_error(stub, b"")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "image is empty" in error.details()


@pytest.mark.parametrize("name", MODELS)
def test_undecodable_image_is_invalid_argument(stub, name):
    error = rpc_error(stub, b"\x00\x01garbage" * 100, model=model(name))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "could not be decoded" in error.details()


@pytest.mark.parametrize("name", MODELS)
def test_truncated_jpeg_is_invalid_argument(stub, name):
    data = scenes.encode(scene_for(90).pixels, "JPEG")
    error = rpc_error(stub, data[: len(data) // 2], model=model(name))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_image_over_the_pixel_limit_is_refused_from_its_header(stub):
    big = encode(Image.new("RGB", (2500, 2000), (128, 128, 128)), "PNG")  # 5 MP, small file
    error = rpc_error(stub, big)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "2500x2000" in error.details() and "GATEWAY_MAX_PIXELS" in error.details()


def test_image_over_the_byte_limit_is_refused(stub):
    error = rpc_error(stub, b"\xff\xd8" + bytes(MAX_IMAGE_BYTES))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GATEWAY_MAX_IMAGE_BYTES" in error.details()


def test_message_over_the_server_receive_limit_is_resource_exhausted(stub):
    error = rpc_error(stub, bytes(MAX_IMAGE_BYTES + 2 * 1024 * 1024))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_largest_allowed_image_passes_in_pixel_mode(stub):
    # 2000x2000 = the pixel limit: 12 MB as a uint8 tensor, over gRPC's 4 MiB default.
    scene = scene_for(91, 2000, 2000, 12, noise=0)
    assert_matches(detect(stub, scenes.encode(scene.pixels, "PNG"), timeout=120), scene)


@pytest.mark.parametrize(
    ("spec", "code", "text"),
    [
        (model_pb2.ModelSpec(name="nope"), grpc.StatusCode.NOT_FOUND, "Latest(nope)"),
        (
            model_pb2.ModelSpec(name="detector", version=9),
            grpc.StatusCode.NOT_FOUND,
            "Specific(detector, 9)",
        ),
        (
            model_pb2.ModelSpec(name="detector", label="beta"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Unrecognized servable version label: beta",
        ),
        (
            model_pb2.ModelSpec(name="detector", version=-3),
            grpc.StatusCode.INVALID_ARGUMENT,
            "positive",
        ),
    ],
)
def test_unknown_model_version_or_label(stub, spec, code, text):
    error = rpc_error(stub, scenes.encode(scene_for(92).pixels, "PNG"), model=spec)
    assert error.code() == code
    assert text in error.details()


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"min_score": 1.5}, "min_score must be in [0, 1]"),
        ({"min_score": -0.1}, "min_score must be in [0, 1]"),
        ({"max_detections": -1}, "max_detections must be >= 0"),
    ],
)
def test_out_of_range_fields_are_invalid_argument(stub, fields, text):
    error = rpc_error(stub, scenes.encode(scene_for(93).pixels, "PNG"), **fields)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in error.details()


def test_model_without_a_detection_signature_is_failed_precondition(stub):
    error = rpc_error(stub, scenes.encode(scene_for(94).pixels, "PNG"), model=model("vector_model"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = error.details()
    assert "features: DT_FLOAT [-1,4]" in details and "probabilities" in details


def test_client_deadline_propagates_to_tf_serving(windowed, recording):
    # TF Serving holds the Predict until released: only the caller's deadline can end the
    # call, and TF Serving must be told that deadline rather than the gateway's own 30 s.
    data = scenes.encode(scene_for(95).pixels, "PNG")
    request_id = f"deadline-{time.monotonic_ns()}"
    with windowed.channel() as channel:
        stub = windowed.stub(channel)
        stub.Detect(pb.DetectRequest(image=data), timeout=60)  # signature cached
        cancelled = recording.cancelled
        recording.hold()
        try:
            # Long enough to reach TF Serving on a loaded machine, far below the gateway's 30 s.
            call = stub.Detect.future(
                pb.DetectRequest(image=data, request_id=request_id), timeout=10
            )
            recording.wait_active(1)
            *_, remaining = (left for name, left in recording.deadlines if name == "Predict")
            error = call.exception(timeout=60)
            # The held TF Serving call sees its caller go away: the gateway cancelled it.
            deadline = time.monotonic() + 30
            while recording.cancelled == cancelled and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            recording.release()
    assert error is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The caller's 10 s, not the gateway's 30 s (gRPC rounds the grpc-timeout header up).
    assert remaining is not None and 0 < remaining < 11
    assert recording.cancelled == cancelled + 1
    [line] = log_lines(windowed, request_id)
    assert line["code"] in ("DEADLINE_EXCEEDED", "CANCELLED")


def test_unreachable_tf_serving_is_unavailable(tmp_path):
    with (
        closed_port() as port,
        run_gateway(dead := f"127.0.0.1:{port}", log_dir=tmp_path, wait_ready=False) as gw,
        gw.channel() as channel,
    ):
        gw.wait_health(2)  # NOT_SERVING
        with pytest.raises(grpc.RpcError) as info:
            gw.stub(channel).Detect(pb.DetectRequest(image=b"x"), timeout=20)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dead in info.value.details()
