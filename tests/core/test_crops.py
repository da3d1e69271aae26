"""A pipeline's crop -> the PredictRequest: the same request as the crop sent alone as PNG
gives, for every input form; and the model's boxes mapped back to the image's."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from gateway.core.crops import Crop, build_crop_input, crop_box
from gateway.core.inputs import InputMode, build_input
from gateway.core.plans import plan_input
from gateway.imaging.header import ImageLimits
from gateway.models import InputPrep
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.signatures import Signature, TensorSpec

LIMITS = ImageLimits(32 << 20, 50_000_000)
ENVELOPE = b""


def sig(dtype: int, shape: tuple[int, ...]) -> Signature:
    return Signature("m", 1, {"x": TensorSpec(dtype, shape)}, {})


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def picture() -> np.ndarray:
    """A 640x480 picture with structure (gradients and noise), as the caller sees it."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:480, 0:640]
    base = np.stack([x * 255 // 639, y * 255 // 479, (x + y) % 256], axis=-1)
    noise = rng.integers(-20, 21, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


FORMS = {
    "uint8 pixels, own size": (tfs.DT_UINT8, (1, -1, -1, 3), InputPrep()),
    "float32 224x224 scaled": (tfs.DT_FLOAT, (-1, 224, 224, 3), InputPrep(scale=1 / 255)),
    "float32 NCHW normalised": (
        tfs.DT_FLOAT, (-1, 3, 224, 224),
        InputPrep(scale=1 / 255, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    ),
    "uint8 max_side 64": (tfs.DT_UINT8, (1, -1, -1, 3), InputPrep(max_side=64)),
    "uint8 letterboxed 128x96": (
        tfs.DT_UINT8, (-1, -1, -1, 3), InputPrep(pad_to=(96, 128), pad_value=114),
    ),
    "float32 tf-bilinear 160x160": (
        tfs.DT_FLOAT, (-1, 160, 160, 3), InputPrep(resize_filter="tf-bilinear"),
    ),
    "BGR 100x100": (tfs.DT_UINT8, (-1, 100, 100, 3), InputPrep(channel_order="BGR")),
    "encoded raw": (tfs.DT_STRING, (-1,), InputPrep()),
    "encoded base64url": (tfs.DT_STRING, (-1,), InputPrep(string_encoding="base64url")),
}  # fmt: skip


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("box", [(100, 50, 260, 230), (0, 0, 640, 480), (600, 470, 640, 480)])
def test_a_crop_is_sent_as_its_pixels_sent_alone_as_png(picture, form, box):
    dtype, shape, prep = FORMS[form]
    plan = plan_input(sig(dtype, shape), prep)
    x_min, y_min, x_max, y_max = box
    pixels = picture[y_min:y_max, x_min:x_max]
    crop = build_crop_input(Crop(pixels, x_min, y_min, 640, 480), plan, ENVELOPE)
    alone = build_input(png(np.ascontiguousarray(pixels)), plan, ENVELOPE, LIMITS)
    assert (crop.dtype, crop.shape, crop.sent) == (alone.dtype, alone.shape, alone.sent)
    if plan.mode is not InputMode.ENCODED:
        assert crop.request == alone.request
        assert crop.tail == alone.tail
        return
    # A PNG the gateway wrote (the caller's is forwarded untouched): the same pixels.
    value = crop.request[-crop.tail :]
    data = base64.urlsafe_b64decode(value) if plan.base64url else value
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), pixels)
    # The answer is about the caller's image, not the crop.
    assert (crop.width, crop.height) == (640, 480)


def test_an_encoded_crop_over_max_side_goes_as_a_jpeg_of_the_scaled_crop(picture):
    plan = plan_input(sig(tfs.DT_STRING, (-1,)), InputPrep(max_side=64))
    crop = build_crop_input(Crop(picture[0:200, 0:300], 0, 0, 640, 480), plan, ENVELOPE)
    assert crop.sent == (64, 43)
    assert crop.request[-crop.tail :][:3] == b"\xff\xd8\xff"  # a JPEG


def test_boxes_of_the_crop_map_to_the_image():
    crop = Crop(np.zeros((100, 200, 3), np.uint8), 40, 30, 400, 300)
    # The crop's whole area is its box in the image.
    assert crop_box((0.0, 0.0, 1.0, 1.0), crop, None) == pytest.approx(
        (30 / 300, 40 / 400, 130 / 300, 240 / 400)
    )

    # Its centre, after a letterbox that put the crop in the top half of the canvas.
    def inner(box):
        return box[0] * 2, box[1], box[2] * 2, box[3]

    assert crop_box((0.25, 0.5, 0.25, 0.5), crop, inner) == pytest.approx(
        ((30 + 50) / 300, (40 + 100) / 400, (30 + 50) / 300, (40 + 100) / 400)
    )


def test_a_box_the_model_finds_in_a_crop_is_in_the_image_s_pixels(picture):
    plan = plan_input(sig(tfs.DT_UINT8, (-1, 64, 64, 3)), InputPrep())
    made = build_crop_input(Crop(picture[100:200, 300:500], 300, 100, 640, 480), plan, ENVELOPE)
    assert made.transform is not None
    ymin, xmin, ymax, xmax = made.transform((0.5, 0.5, 1.0, 1.0))
    assert (xmin * 640, ymin * 480, xmax * 640, ymax * 480) == pytest.approx((400, 150, 500, 200))
    whole = build_crop_input(Crop(picture, 0, 0, 640, 480), plan, ENVELOPE)
    assert whole.transform is None  # the whole picture: nothing to map
