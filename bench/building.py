"""Section 1: building the Predict request from encoded image bytes, three ways side by side.

(a) the recipe of TF Serving's client examples: PIL decode -> np.array ->
    tf.make_tensor_proto -> PredictRequest -> bytes; the response read with
    np.array(outputs[...].float_val);
(b) the gateway: gateway.core.inputs.build_input from encoded bytes to the serialized request;
    the response read as the detection task reads it (gateway.upstream.tensors.Output);
(c) the floor: libjpeg-turbo decoding alone (simplejpeg, into a new array); for PNG, Pillow's
    decode alone.

(b) and (c) run interleaved (b, c, b, c, ...), so machine noise hits both alike; (a) runs in
its own loop, or in a process of its own (`run(..., parts)`, as bench.recipe does, since
the recipe's allocations change glibc's state for whatever runs after it). The median of
each is reported, with the minor page faults per call.
"""

from __future__ import annotations

import io
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

from bench import upstream
from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.domain import ModelRef
from gateway.imaging.header import ImageLimits
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.detection import BOXES, CLASSES, NUM_DETECTIONS, REQUIRED_OUTPUTS, SCORES
from gateway.upstream.client import request_envelope
from gateway.upstream.tensors import OutputTensor

LIMITS = ImageLimits(max_bytes=256 * 1024 * 1024, max_pixels=100_000_000)


@dataclass(frozen=True)
class Row:
    name: str
    image_bytes: int
    recipe_ms: float
    gateway_ms: float
    floor_ms: float
    request_bytes: int
    recipe_faults: float = 0.0  # minor page faults per call (median)
    gateway_faults: float = 0.0


# Minor page faults per call, by case name, from the last _medians run (load-independent:
# a fault is fresh memory the kernel maps in, whatever else the machine is doing).
FAULTS: dict[str, float] = {}


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _medians(cases: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    faults: dict[str, list[int]] = {name: [] for name in cases}
    for case in cases.values():  # warm-up: imports, first-touch allocations
        case()
    for _ in range(repeat):
        for name, case in cases.items():
            before = _minor_faults()
            started = time.perf_counter()
            case()
            times[name].append(time.perf_counter() - started)
            faults[name].append(_minor_faults() - before)
    FAULTS.update({name: statistics.median(values) for name, values in faults.items()})
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def recipe_request(data: bytes, tf: Any, predict_pb2: Any) -> bytes:
    """The TF Serving client-example way (what a hand-written client does)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    pixels = np.array(image)[np.newaxis]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "pixels"
    request.model_spec.signature_name = "serving_default"
    request.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto(pixels))
    request.output_filter.extend(REQUIRED_OUTPUTS)
    return bytes(request.SerializeToString())


def floor(data: bytes) -> np.ndarray:
    if data.startswith(b"\xff\xd8"):
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return np.asarray(image)


def run(
    photos: dict[str, bytes], repeat: int, parts: tuple[str, ...] = ("recipe", "gateway")
) -> tuple[list[Row], dict[str, float]]:
    """Request building per image, and response parsing (µs) recipe vs gateway. `parts`
    leaves the recipe or the gateway (with the floor) out, so each can be measured in a
    process the other never ran in (their allocations change the allocator's state);
    a part left out is NaN in the rows."""
    if "recipe" in parts:
        import tensorflow as tf  # the recipe needs it; the gateway never imports it
        from tensorflow_serving.apis import predict_pb2

    nan = float("nan")
    envelope = request_envelope(ModelRef("pixels"), REQUIRED_OUTPUTS)
    rows = []
    for name, data in photos.items():
        pixels = name.split()[1]
        count = max(3, repeat // 4) if pixels.startswith("4032") else repeat

        def gateway_case(data: bytes = data) -> bytes:
            return build_input(
                data, InputPlan("input_tensor", InputMode.PIXELS), envelope, LIMITS
            ).request

        medians = {"recipe": nan, "gateway": nan, "floor": nan}
        faults = {"recipe": nan, "gateway": nan}
        if "recipe" in parts:
            medians |= _medians(
                {"recipe": lambda data=data: recipe_request(data, tf, predict_pb2)},  # type: ignore[misc]
                count,
            )
            faults["recipe"] = FAULTS["recipe"]
        if "gateway" in parts:
            # The gateway and the decode floor interleaved: machine noise hits both alike.
            medians |= _medians(
                {"gateway": gateway_case, "floor": lambda data=data: floor(data)},  # type: ignore[misc]
                count,
            )
            faults["gateway"] = FAULTS["gateway"]
        ours = gateway_case()
        if "recipe" in parts:
            assert len(ours) == len(recipe_request(data, tf, predict_pb2))
        rows.append(
            Row(
                name,
                len(data),
                medians["recipe"],
                medians["gateway"],
                medians["floor"],
                len(ours),
                faults["recipe"],
                faults["gateway"],
            )
        )
    if "recipe" not in parts:
        return rows, {"recipe": nan, "gateway": nan}

    response = upstream.predict_response("pixels")
    official = predict_pb2.PredictResponse

    def recipe_parse() -> object:
        result = official.FromString(response)
        return {k: np.array(result.outputs[k].float_val) for k in REQUIRED_OUTPUTS}

    def gateway_parse() -> object:
        # What the detection task reads: every output checked, the used rows as numbers.
        result = tfs.PredictResponse.FromString(response)
        outputs = {k: OutputTensor(v) for k, v in result.outputs.items()}
        found = int(outputs[NUM_DETECTIONS].head(1)[0])
        rows = [outputs[k].head(found) for k in (SCORES, CLASSES)]
        return [outputs[BOXES].head(4 * found), *rows]

    parse = _medians({"recipe": recipe_parse, "gateway": gateway_parse}, repeat * 20)
    return rows, {k: v * 1e3 for k, v in parse.items()}


def table(rows: list[Row], parse_us: dict[str, float]) -> list[str]:
    lines = [
        "| image | encoded | (a) recipe | (b) gateway | (c) decode floor | (a)/(b) | (b)/(c) "
        "| request bytes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.image_bytes / 1e6:.2f} MB | {r.recipe_ms:.2f} ms "
            f"| {r.gateway_ms:.2f} ms | {r.floor_ms:.2f} ms "
            f"| {r.recipe_ms / r.gateway_ms:.2f}x | {r.gateway_ms / r.floor_ms:.3f}x "
            f"| {r.request_bytes / 1e6:.2f} MB |"
        )
    lines += [
        "",
        "Reading a PredictResponse (4 outputs, 100 detections, `float_val` as TF Serving sends "
        f"by default): recipe `np.array(float_val)` {parse_us['recipe']:.0f} µs, gateway "
        "(`OutputTensor` per tensor, then the rows the detector found) "
        f"{parse_us['gateway']:.0f} µs "
        f"({parse_us['recipe'] / parse_us['gateway']:.1f}x).",
    ]
    return lines
