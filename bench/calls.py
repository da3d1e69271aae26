"""The calls the benches make: the DetectRequest the gateway is sent, the equivalent
PredictRequest the gateway sends (what direct calls to the upstream send), and calls one
after another."""

from __future__ import annotations

import time

import grpc

from bench import load
from bench import upstream as bench_upstream
from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.domain import ModelRef
from gateway.imaging.header import ImageLimits
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.detection import REQUIRED_OUTPUTS
from gateway.upstream.client import request_envelope

LIMITS = ImageLimits(max_bytes=64 * 1024 * 1024, max_pixels=50_000_000)
MODES = {"string": ("encoded", InputMode.ENCODED), "pixel": ("pixels", InputMode.PIXELS)}


def send(target: str, method: str, body: bytes, calls: int) -> list[float]:
    """`calls` calls one after another; milliseconds each."""
    with grpc.insecure_channel(target, options=load.CHANNEL_OPTIONS) as channel:
        stub = channel.unary_unary(method)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            stub(body, timeout=120)
            times.append((time.perf_counter() - started) * 1e3)
    return times


def sent_upstream(up: str, target: str, body: bytes, calls: int = 3) -> float:
    """Bytes per request that arrived at the bench upstream for calls to `target`."""
    send(target, load.DETECT, body, 1)  # warm-up (signature fetch)
    requests_before, bytes_before = bench_upstream.stats(up)
    send(target, load.DETECT, body, calls)
    requests_after, bytes_after = bench_upstream.stats(up)
    assert requests_after - requests_before == calls, "the gateway made one Predict per image"
    return (bytes_after - bytes_before) / calls


def detect_body(image: bytes, model: str) -> bytes:
    return pb.DetectRequest(image=image, model=model_pb2.ModelSpec(name=model)).SerializeToString()


def predict_body(image: bytes, mode: str) -> bytes:
    """The PredictRequest the default gateway sends for `image` (what direct calls send)."""
    model, input_mode = MODES[mode]
    envelope = request_envelope(ModelRef(model), REQUIRED_OUTPUTS)
    return build_input(image, InputPlan("input_tensor", input_mode), envelope, LIMITS).request
