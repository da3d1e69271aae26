"""Detect calls through a gateway process and the checks of their answers against the scenes'
painted rectangles, for tests/e2e/detection: the gateway's limits there, a TF Serving proxy
that keeps every Predict it forwards, the size of the image a Predict sent, the gateway's log
lines for one request."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from PIL import Image

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfswire
from gateway.proto.vision.v1 import model_pb2
from gateway.upstream.client import PREDICT
from serving import scenes
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess

MODELS = ("detector", "detector_encoded")
# The limits of the package's gateway (tests/e2e/detection/conftest.py).
MAX_PIXELS = 4_000_000
MAX_IMAGE_BYTES = 8 * 1024 * 1024
STREAM_WINDOW = 2
# serving/gateway-models.toml: max_side 1024 for the reference detectors.
EXAMPLE_MODEL_CONFIG = Path(__file__).resolve().parents[2] / "serving" / "gateway-models.toml"


def detect(stub: Any, image: bytes, timeout: float = 60, **fields) -> pb.DetectionResult:
    model = fields.pop("model", None)
    request = pb.DetectRequest(image=image, **fields)
    if model is not None:
        request.model.CopyFrom(model)
    return stub.Detect(request, timeout=timeout)


def rpc_error(stub: Any, image: bytes, **fields) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        detect(stub, image, **fields)
    return info.value


def assert_matches(result: pb.DetectionResult, scene: scenes.Scene, tolerance: int = 1) -> None:
    """Every painted rectangle found with its class and a box within `tolerance` px; nothing
    else scores 0.5 or more."""
    assert (result.image_width, result.image_height) == (scene.width, scene.height)
    unmatched = list(result.detections)
    for truth in scene.boxes:
        match = next(
            (
                d
                for d in unmatched
                if d.class_id == truth.class_id
                and abs(d.box.x_min - truth.x_min) <= tolerance
                and abs(d.box.y_min - truth.y_min) <= tolerance
                and abs(d.box.x_max - truth.x_max) <= tolerance
                and abs(d.box.y_max - truth.y_max) <= tolerance
            ),
            None,
        )
        assert match is not None, f"{truth} not found in {result.detections}"
        assert match.label == truth.label.replace("_", " ")
        unmatched.remove(match)
    assert [d for d in unmatched if d.score >= 0.5] == []
    scores = [d.score for d in result.detections]
    assert scores == sorted(scores, reverse=True)


def scene_for(
    seed: int, width: int = 480, height: int = 360, rects: int = 6, noise: float = 4.0
) -> scenes.Scene:
    rng = np.random.default_rng(seed)
    return scenes.generate_scene(rng, width, height, rects, noise_sigma=noise)


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def model(name: str, **choice) -> model_pb2.ModelSpec:
    return model_pb2.ModelSpec(name=name, **choice)


class RecordingUpstream(FaultyUpstream):
    """Forwards to the local TF Serving and keeps every Predict request's bytes."""

    def __init__(self, backend: str) -> None:
        super().__init__(backend)
        self.predicts: list[bytes] = []

    def _handler(self, path: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        handle = super()._handler(path)
        if path != PREDICT:
            return handle

        def record(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.predicts.append(request)
            return handle(request, context)

        return record


def sent_size(request: bytes) -> tuple[int, int]:
    """(width, height) of the image in a PredictRequest: the pixel tensor's shape, or the
    header of the encoded image in a string tensor."""
    (tensor,) = tfswire.PredictRequest.FromString(request).inputs.values()
    if tensor.dtype == tfswire.DT_STRING:
        (value,) = tensor.string_val
        with Image.open(io.BytesIO(value)) as image:
            return image.size
    _, height, width, _ = (d.size for d in tensor.tensor_shape.dim)
    return width, height


def log_lines(gateway: GatewayProcess, request_id: str) -> list[dict]:
    """The gateway's log lines for `request_id`, once there are any. The line is written
    when the request ends, which the caller may see a moment before it is flushed."""
    deadline = time.monotonic() + 30
    while not (lines := [r for r in gateway.records() if r.get("request_id") == request_id]):
        assert time.monotonic() < deadline, f"no log line for {request_id}"
        time.sleep(0.02)
    return lines
