"""What TensorFlow's decoders make of what the gateway forwards (model_can_decode: a model that
decodes in its graph gets the pixels the gateway would have sent), and encode_png's exact round
trip.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gateway.imaging.decode import decode_image, encode_png
from gateway.imaging.header import inspect_image, model_can_decode
from tests.support.pictures import LIMITS, encode, pattern, raw_png


def _photo(mode: str = "RGB") -> Image.Image:
    """Content that shows decoder differences (a blank image decodes the same anywhere)."""
    return Image.fromarray(pattern()).convert(mode)


def _sixteen_bit_gray() -> bytes:
    return encode(
        Image.fromarray((np.arange(48 * 32).reshape(32, 48) * 40).astype(np.uint16)), "PNG"
    )


# (bytes, model_can_decode, what tf.io.decode_image(channels=3) gives compared with ours):
# "same" pixels, "near" (JPEG: another IDCT, a few levels apart), "differs", "error",
# or "frames" (a 4-D stack, as the OD API's decode_image with expand_animations=True does).
TF_CASES = {
    "JPEG RGB": (encode(_photo(), "JPEG", quality=95), True, "near"),
    "JPEG L": (encode(_photo("L"), "JPEG", quality=95), True, "near"),
    "PNG L": (encode(_photo("L"), "PNG"), True, "same"),
    "PNG LA": (encode(_photo("LA"), "PNG"), True, "same"),
    "PNG RGB": (encode(_photo(), "PNG"), True, "same"),
    "PNG RGBA": (encode(_photo("RGBA"), "PNG"), True, "same"),
    "PNG P 1-bit indices": (encode(_photo().quantize(2), "PNG"), True, "same"),
    "PNG P 8-bit indices": (encode(_photo().quantize(256), "PNG"), True, "same"),
    # Transcoded because TF's pixels are not Pillow's, or TF cannot read them at all.
    "JPEG CMYK": (encode(_photo("CMYK"), "JPEG", quality=95), False, "differs"),
    "TIFF": (encode(_photo(), "TIFF"), False, "error"),
    "GIF": (encode(_photo(), "GIF"), False, "frames"),
    # Transcoded although TF 2.21's decode_image gives the same pixels: the gateway only
    # forwards 8-bit PNG and JPEG untouched (graphs often decode with decode_jpeg or
    # decode_png alone, which do not read BMP or WebP). Kept here so a change shows.
    "PNG 4-bit gray": (raw_png(2, 1, 4, 0, [b"\x1f"]), False, "same"),
    "PNG 1-bit": (encode(_photo("1"), "PNG"), False, "same"),
    "PNG 16-bit gray": (_sixteen_bit_gray(), False, "same"),
    "PNG 16-bit RGB": (raw_png(2, 1, 16, 2, [bytes(range(0, 120, 10))]), False, "same"),
    "PNG 16-bit RGBA": (raw_png(2, 1, 16, 6, [bytes(range(0, 160, 10))]), False, "same"),
    "BMP": (encode(_photo(), "BMP"), False, "same"),
    "WebP lossless": (encode(_photo(), "WEBP", lossless=True), False, "same"),
}


# JPEG decoders may use different IDCTs (libjpeg-turbo's islow in Pillow, TF's own choice).
JPEG_LEVELS = 8


@pytest.mark.parametrize(("data", "forwarded", "tf_gives"), TF_CASES.values(), ids=TF_CASES)
def test_model_can_decode_what_tensorflow_decodes_to_our_pixels(
    data: bytes, forwarded: bool, tf_gives: str
) -> None:
    import tensorflow as tf

    assert model_can_decode(inspect_image(data, LIMITS)) is forwarded
    _, ours = decode_image(data, LIMITS)
    if tf_gives == "error":
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.io.decode_image(data, channels=3, expand_animations=False)
        return
    if tf_gives == "frames":
        assert tf.io.decode_image(data, channels=3).shape.rank == 4
        return
    theirs = tf.io.decode_image(data, channels=3, expand_animations=False).numpy()
    assert theirs.shape == ours.shape
    difference = int(np.abs(theirs.astype(np.int16) - ours).max())
    if tf_gives == "same":
        assert difference == 0
    elif tf_gives == "near":
        assert 0 <= difference <= JPEG_LEVELS
    else:
        assert difference > 0


def test_encode_png_round_trips_exactly() -> None:
    pixels = pattern()
    info, decoded = decode_image(encode_png(pixels), LIMITS)
    assert (info.format, info.mode) == ("PNG", "RGB")
    np.testing.assert_array_equal(decoded, pixels)


def test_encode_png_accepts_decoded_and_non_contiguous_arrays() -> None:
    _, decoded = decode_image(encode(Image.fromarray(pattern()), "PNG"), LIMITS)
    flipped = decoded[:, ::-1]
    _, again = decode_image(encode_png(flipped), LIMITS)
    np.testing.assert_array_equal(again, flipped)


@pytest.mark.parametrize(
    "pixels",
    [
        np.zeros((4, 4, 3), np.float32),
        np.zeros((4, 4), np.uint8),
        np.zeros((4, 4, 4), np.uint8),
    ],
)
def test_encode_png_refuses_anything_but_uint8_rgb(pixels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="uint8"):
        encode_png(pixels)
