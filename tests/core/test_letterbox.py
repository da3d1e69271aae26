"""Letterboxing (`input.pad_to`): the canvas sent, and boxes on it mapped back to the image."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.core.letterbox import content_size, decode_letterboxed, unletterbox
from gateway.core.plans import plan_input
from gateway.domain import ModelRef
from gateway.errors import GatewayError
from gateway.imaging.header import ImageLimits
from gateway.models import InputPrep
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import request_envelope
from gateway.upstream.signatures import Signature, TensorSpec

LIMITS = ImageLimits(max_bytes=1 << 24, max_pixels=10_000_000)


def png(pixels: np.ndarray, orientation: int = 1) -> bytes:
    out = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(out, format="PNG", exif=exif.tobytes())
    return out.getvalue()


@pytest.mark.parametrize(
    ("size", "canvas", "content"),
    [
        ((640, 480), (320, 320), (320, 240)),  # reduced, landscape
        ((300, 600), (320, 320), (160, 320)),  # reduced, portrait
        ((100, 50), (400, 300), (400, 200)),  # enlarged to the width
        ((320, 320), (320, 320), (320, 320)),  # as it is
        ((5000, 3), (64, 64), (64, 1)),  # never below one pixel
    ],
)
def test_the_image_is_scaled_to_fit_keeping_its_aspect_ratio(size, canvas, content):
    assert content_size(*size, canvas) == content


def test_the_canvas_holds_the_image_top_left_and_the_pad_value_elsewhere():
    pixels = np.zeros((100, 200, 3), np.uint8)
    pixels[:, :] = (10, 200, 30)
    info, canvas, transform = decode_letterboxed(png(pixels), LIMITS, (128, 96), 114)
    assert (info.width, info.height) == (200, 100) and canvas.shape == (96, 128, 3)
    assert (canvas[:64, :128] == (10, 200, 30)).all()  # 200x100 fits as 128x64
    assert (canvas[64:] == 114).all()
    # The content's bottom-right corner on the canvas is the image's.
    assert transform((0.0, 0.0, 64 / 96, 1.0)) == pytest.approx((0.0, 0.0, 1.0, 1.0))


def test_a_box_found_on_the_canvas_maps_back_to_the_displayed_image_exactly():
    # An EXIF-rotated photo: stored 300x200, shown 200x300 (orientation 6).
    shown = np.full((300, 200, 3), 90, np.uint8)
    shown[30:120, 50:150] = (230, 25, 25)  # a box at x 50..150, y 30..120 as shown
    stored = np.ascontiguousarray(np.rot90(shown, 1))  # what orientation 6 turns back
    info, canvas, transform = decode_letterboxed(png(stored, 6), LIMITS, (160, 160), 0)
    assert (info.width, info.height) == (200, 300)
    red = np.argwhere(canvas[..., 0] > (230 + 90) // 2)  # edges half-way, as a detector puts them
    (y0, x0), (y1, x1) = red.min(axis=0), red.max(axis=0) + 1
    box = transform((y0 / 160, x0 / 160, y1 / 160, x1 / 160))
    in_pixels = [box[1] * 200, box[0] * 300, box[3] * 200, box[2] * 300]
    assert in_pixels == pytest.approx([50, 30, 150, 120], abs=1.0)
    assert unletterbox((0.5, 0.5, 1.0, 1.0), 2.0, 4.0) == (1.0, 2.0, 2.0, 4.0)


def signature(shape: tuple[int, ...]) -> Signature:
    return Signature("m", 1, {"x": TensorSpec(tfs.DT_UINT8, shape)}, {})


def test_build_input_sends_the_canvas_at_the_batch_size_of_one():
    plan = plan_input(signature((-1, -1, -1, 3)), InputPrep(pad_to=(64, 96), pad_value=7))
    assert plan == InputPlan("x", InputMode.PIXELS, pad_to=(96, 64), pad_value=7)
    assert plan.describe()["pad_to"] == "96x64 (letterbox, pad value 7)"
    pixels = np.full((40, 40, 3), 200, np.uint8)
    built = build_input(png(pixels), plan, request_envelope(ModelRef("m"), []), LIMITS)
    assert built.shape == (1, 64, 96, 3) and built.tail == 64 * 96 * 3
    sent = np.frombuffer(built.request[-built.tail :], np.uint8).reshape(64, 96, 3)
    assert (sent[:, :64] == 200).all() and (sent[:, 64:] == 7).all()
    assert (built.width, built.height, built.sent) == (40, 40, (96, 64))


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((-1, 320, 320, 3), "fixes the size of its input 'x'"),
        ((1, -1, -1, 3), "fixes the batch of its input 'x' [1,-1,-1,3] at 1"),
    ],
)
def test_pad_to_where_it_cannot_serve_batching_is_a_bad_model(shape, message):
    with pytest.raises(GatewayError) as info:
        plan_input(signature(shape), InputPrep(pad_to=(64, 64)))
    assert message in info.value.message
