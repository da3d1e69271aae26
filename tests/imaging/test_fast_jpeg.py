"""The libjpeg-turbo fast path gives Pillow's pixels for every kind of JPEG, and the request
bytes the gateway writes around them are the PredictRequest protobuf would write.

Pillow (with exif_transpose) is the reference: it was the gateway's only decoder before, so
any difference here would be a behaviour change. Both use libjpeg-turbo with the same IDCT and
upsampling, so the pixels agree exactly; the tolerance only allows for a Pillow build with
another libjpeg.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageOps

from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.domain import ModelRef
from gateway.imaging import decode
from gateway.imaging.decode import decode_image
from gateway.imaging.errors import CorruptImage
from gateway.imaging.header import ImageInfo, ImageLimits
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.detection import REQUIRED_OUTPUTS
from gateway.upstream.client import request_envelope
from gateway.upstream.tensors import image_tensor, string_tensor, to_array
from gateway.upstream.wire import predict_request

LIMITS = ImageLimits(max_bytes=64 * 1024 * 1024, max_pixels=10_000_000)
JPEG_TOLERANCE = 2


def photo(width: int = 203, height: int = 131, seed: int = 0) -> np.ndarray:
    """Photo-like pixels: smooth shading, mid-scale structure and sensor noise (odd sizes
    exercise partial MCUs)."""
    rng = np.random.default_rng(seed)
    total = np.full((height, width, 3), 128.0, np.float32)
    for cells, amplitude in ((4, 90.0), (16, 40.0)):
        coarse = rng.random((cells, cells, 3), dtype=np.float32) * 255
        smooth = Image.fromarray(coarse.astype(np.uint8)).resize(
            (width, height), Image.Resampling.BICUBIC
        )
        total += (np.asarray(smooth, np.float32) - 128) * amplitude / 128
    total += rng.normal(0, 5, (height, width, 3)).astype(np.float32)
    return np.clip(total, 0, 255).astype(np.uint8)


def jpeg(image: Image.Image, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def with_orientation(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def pillow_pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


RGB = Image.fromarray(photo())
# name -> (encoded JPEG, whether libjpeg-turbo decodes it; False: Pillow's path)
VARIANTS: dict[str, tuple[Callable[[], bytes], bool]] = {
    "baseline_420": (lambda: jpeg(RGB, quality=90, subsampling=2), True),
    "baseline_422": (lambda: jpeg(RGB, quality=90, subsampling=1), True),
    "baseline_444": (lambda: jpeg(RGB, quality=95, subsampling=0), True),
    "progressive": (lambda: jpeg(RGB, quality=85, progressive=True), True),
    "optimized_huffman": (lambda: jpeg(RGB, quality=75, optimize=True), True),
    "restart_markers": (lambda: jpeg(RGB, quality=90, restart_marker_rows=1), True),
    "rgb_without_ycbcr": (lambda: jpeg(RGB, quality=90, keep_rgb=True, subsampling=0), True),
    "grayscale": (lambda: jpeg(RGB.convert("L"), quality=90), True),
    "grayscale_progressive": (lambda: jpeg(RGB.convert("L"), progressive=True), True),
    "cmyk_adobe": (lambda: jpeg(RGB.convert("CMYK"), quality=90), False),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_every_jpeg_variant_decodes_to_pillows_pixels(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, fast = VARIANTS[name]
    data = make()
    calls = _count_fast_decodes(monkeypatch)
    info, pixels = decode_image(data, LIMITS)
    expected = pillow_pixels(data)
    assert pixels.shape == expected.shape == (131, 203, 3)
    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= JPEG_TOLERANCE
    assert pixels.flags.c_contiguous and not pixels.flags.writeable
    assert (calls["n"] > 0) == fast, f"{name}: {info.mode} JPEG took the wrong decoder"


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("name", ["baseline_420", "progressive", "grayscale"])
def test_exif_orientation_on_the_fast_path_matches_exif_transpose(
    name: str, orientation: int
) -> None:
    with Image.open(io.BytesIO(VARIANTS[name][0]())) as source:
        data = jpeg(source, quality=90, exif=with_orientation(orientation))
    info, pixels = decode_image(data, LIMITS)
    expected = pillow_pixels(data)
    assert (info.width, info.height) == (expected.shape[1], expected.shape[0])
    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= JPEG_TOLERANCE

    written = {}

    def into(shown: ImageInfo) -> np.ndarray:
        written["array"] = np.zeros((shown.height, shown.width, 3), np.uint8)
        return written["array"]

    _, same = decode_image(data, LIMITS, into=into)
    assert same is written["array"]
    np.testing.assert_array_equal(same, pixels)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
@pytest.mark.parametrize("name", ["baseline_420", "progressive", "restart_markers"])
def test_truncated_jpeg_is_still_refused_as_corrupt(name: str, cut: float) -> None:
    data = VARIANTS[name][0]()
    truncated = data[: int(len(data) * cut)]
    with pytest.raises(CorruptImage, match="truncated or damaged"):
        decode_image(truncated, LIMITS)


def test_jpeg_with_a_libjpeg_warning_is_decoded_as_pillow_decodes_it() -> None:
    # Stray bytes before the SOS marker: libjpeg warns ("extraneous bytes before marker"),
    # simplejpeg's strict mode refuses, Pillow ignores the warning; the gateway did and does
    # accept the image.
    data = VARIANTS["baseline_420"][0]()
    scan = data.index(b"\xff\xda")
    damaged = data[:scan] + b"\x00\x01\x02" + data[scan:]
    with pytest.raises(ValueError):
        simplejpeg.decode_jpeg(damaged, strict=True)
    _, pixels = decode_image(damaged, LIMITS)
    np.testing.assert_array_equal(pixels, pillow_pixels(damaged))
    # The same through the request builder, whose buffer the failed fast decode already took.
    envelope = request_envelope(ModelRef("detector"), REQUIRED_OUTPUTS)
    built = build_input(damaged, InputPlan("input_tensor", InputMode.PIXELS), envelope, LIMITS)
    sent = to_array(tfs.PredictRequest.FromString(built.request).inputs["input_tensor"])
    np.testing.assert_array_equal(sent[0], pixels)


def _count_fast_decodes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts calls into the real simplejpeg decoder (a pass-through spy)."""
    calls = {"n": 0}
    real = simplejpeg.decode_jpeg

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(decode.simplejpeg, "decode_jpeg", counting)
    return calls


# --- the request bytes ----------------------------------------------------------------------

ENVELOPES = {
    "version": request_envelope(ModelRef("detector", version=300), REQUIRED_OUTPUTS),
    "label": request_envelope(ModelRef("detector", label="canary"), REQUIRED_OUTPUTS),
    "latest": request_envelope(ModelRef("a" * 200), REQUIRED_OUTPUTS),
}


def _reference_request(envelope: bytes, key: str, tensor: tfs.TensorProto) -> tfs.PredictRequest:
    request = tfs.PredictRequest.FromString(envelope)
    request.inputs[key].CopyFrom(tensor)
    return request


@pytest.mark.parametrize("envelope", ENVELOPES)
@pytest.mark.parametrize("mode", [InputMode.PIXELS, InputMode.FLOAT_PIXELS])
@pytest.mark.parametrize("name", ["baseline_420", "grayscale", "cmyk_adobe"])
def test_pixel_request_bytes_parse_as_the_protobuf_request(
    name: str, mode: InputMode, envelope: str
) -> None:
    data = VARIANTS[name][0]()
    built = build_input(data, InputPlan("input_tensor", mode), ENVELOPES[envelope], LIMITS)
    parsed = tfs.PredictRequest.FromString(built.request)
    pixels = decode_image(data, LIMITS)[1]
    if mode is InputMode.FLOAT_PIXELS:
        pixels = pixels.astype(np.float32)
    expected = _reference_request(ENVELOPES[envelope], "input_tensor", image_tensor(pixels))
    assert parsed == expected
    # Our field order differs from protobuf's, nothing else: same length, same message.
    assert len(built.request) == len(expected.SerializeToString())
    np.testing.assert_array_equal(to_array(parsed.inputs["input_tensor"])[0], pixels)
    assert (built.width, built.height) == (203, 131)


@pytest.mark.parametrize("envelope", ENVELOPES)
def test_encoded_request_bytes_carry_the_original_jpeg(envelope: str) -> None:
    data = jpeg(RGB, quality=90, exif=with_orientation(6))
    built = build_input(data, InputPlan("images", InputMode.ENCODED), ENVELOPES[envelope], LIMITS)
    parsed = tfs.PredictRequest.FromString(built.request)
    assert parsed == _reference_request(ENVELOPES[envelope], "images", string_tensor([data]))
    # The string mode overhead: envelope, key and a few length fields.
    assert len(built.request) - len(data) < len(ENVELOPES[envelope]) + 32
    assert (built.width, built.height) == (131, 203)
    assert built.transform is not None


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 3 * 4032 * 3024])
def test_length_fields_around_the_payload_are_protobuf_varints(size: int) -> None:
    envelope = ENVELOPES["version"]
    buffer = predict_request(envelope, "input_tensor", tfs.DT_UINT8, (1, size, 1, 1), size)
    buffer.payload[:] = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    parsed = tfs.PredictRequest.FromString(buffer.data)
    tensor = parsed.inputs["input_tensor"]
    assert len(tensor.tensor_content) == size
    assert tensor.tensor_content[:300] == (bytes(range(256)) * 2)[: min(size, 300)]
    assert [d.size for d in tensor.tensor_shape.dim] == [1, size, 1, 1]
    assert parsed.model_spec.version.value == 300
