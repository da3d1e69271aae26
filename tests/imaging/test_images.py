"""gateway.imaging.decode on real images built here (tests/support/pictures.py): every format to
the exact pixels (or within a lossy format's tolerance), the header's format, mode and size,
and every colour mode (grayscale, 1-bit, 16-bit, float, palette, alpha, CMYK) to RGB.

The rest of the imaging package's tests on these images: test_orientation.py,
test_header_limits.py, test_transcoding.py.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from gateway.imaging.decode import decode_image
from gateway.imaging.errors import (
    UnsupportedImage,
)
from gateway.imaging.header import ImageInfo, inspect_image
from tests.support.pictures import LIMITS, LOSSLESS, LOSSY, encode, pattern, raw_png, rgb


@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_formats_decode_to_the_exact_pixels(name: str) -> None:
    fmt, options = LOSSLESS[name]
    expected = pattern()
    info, pixels = decode_image(encode(Image.fromarray(expected), fmt, **options), LIMITS)
    assert info.format == fmt
    assert (info.stored_width, info.stored_height) == (48, 32)
    np.testing.assert_array_equal(pixels, expected)


@pytest.mark.parametrize("name", LOSSY)
def test_lossy_formats_decode_within_tolerance(name: str) -> None:
    fmt, options = LOSSY[name]
    expected = pattern()
    info, pixels = decode_image(encode(Image.fromarray(expected), fmt, **options), LIMITS)
    assert info.format == fmt
    error = np.abs(pixels.astype(int) - expected.astype(int))
    assert error.mean() < 2
    assert error.max() < 16


def test_gif_decodes_its_palette_colours_exactly() -> None:
    indices = (np.arange(32 * 48).reshape(32, 48) % 256).astype(np.uint8)
    palette = np.random.default_rng(1).integers(0, 256, (256, 3), dtype=np.uint8)
    image = Image.frombytes("P", (48, 32), indices.tobytes())
    image.putpalette(palette.tobytes())
    info, pixels = decode_image(encode(image, "GIF"), LIMITS)
    assert (info.format, info.mode) == ("GIF", "P")
    np.testing.assert_array_equal(pixels, palette[indices])


def test_animated_gif_decodes_the_first_frame() -> None:
    red = Image.new("RGB", (20, 10), (255, 0, 0))
    blue = Image.new("RGB", (20, 10), (0, 0, 255))
    data = encode(red, "GIF", save_all=True, append_images=[blue], duration=100, loop=0)
    with Image.open(io.BytesIO(data)) as check:
        assert getattr(check, "n_frames", 1) == 2
    _, pixels = decode_image(data, LIMITS)
    np.testing.assert_array_equal(pixels, np.full((10, 20, 3), (255, 0, 0), np.uint8))


def test_decoded_array_is_contiguous_uint8_height_width_rgb() -> None:
    _, pixels = decode_image(encode(Image.fromarray(pattern(48, 32)), "PNG"), LIMITS)
    assert pixels.dtype == np.uint8
    assert pixels.shape == (32, 48, 3)
    assert pixels.flags.c_contiguous


@pytest.mark.parametrize(
    ("fmt", "options", "mode"),
    [
        ("JPEG", {}, "RGB"),
        ("PNG", {}, "RGB"),
        ("GIF", {}, "P"),
        ("BMP", {}, "RGB"),
        ("WEBP", {}, "RGB"),
        ("TIFF", {}, "RGB"),
    ],
)
def test_inspect_reports_format_mode_and_size_from_the_header(
    fmt: str, options: dict[str, Any], mode: str
) -> None:
    data = encode(Image.fromarray(pattern(48, 32)), fmt, **options)
    info = inspect_image(data, LIMITS)
    assert info == ImageInfo(fmt, mode, 48, 32, 1, 8)
    assert (info.width, info.height) == (48, 32)


def test_grayscale_png_is_replicated_to_rgb() -> None:
    gray = pattern()[..., 0]
    info, pixels = decode_image(encode(Image.fromarray(gray), "PNG"), LIMITS)
    assert info.mode == "L"
    np.testing.assert_array_equal(pixels, rgb(gray))


def test_one_bit_png_becomes_black_and_white() -> None:
    bits = pattern()[..., 0] > 127
    info, pixels = decode_image(encode(Image.fromarray(bits), "PNG"), LIMITS)
    assert (info.mode, info.bit_depth) == ("1", 1)
    np.testing.assert_array_equal(pixels, rgb(np.where(bits, 255, 0).astype(np.uint8)))


def test_16_bit_grayscale_png_keeps_the_high_byte() -> None:
    samples = np.linspace(0, 65535, 32 * 48).reshape(32, 48).astype(np.uint16)
    info, pixels = decode_image(encode(Image.fromarray(samples), "PNG"), LIMITS)
    assert (info.mode, info.bit_depth) == ("I;16", 16)
    np.testing.assert_array_equal(pixels, rgb((samples >> 8).astype(np.uint8)))


def test_16_bit_rgb_png_keeps_the_high_byte() -> None:
    samples = (np.arange(4 * 6 * 3).reshape(4, 6, 3) * 900).astype(">u2")
    data = raw_png(6, 4, 16, 2, [row.tobytes() for row in samples])
    info, pixels = decode_image(data, LIMITS)
    assert (info.mode, info.bit_depth) == ("RGB", 16)
    np.testing.assert_array_equal(pixels, (samples >> 8).astype(np.uint8))


def test_32_bit_integer_tiff_is_read_as_16_bit_data() -> None:
    samples = np.array([[-5, 0, 255, 256, 40000, 65535, 70000]], dtype=np.int32)
    info, pixels = decode_image(encode(Image.fromarray(samples), "TIFF"), LIMITS)
    assert info.mode == "I"
    np.testing.assert_array_equal(pixels, rgb(np.array([[0, 0, 0, 1, 156, 255, 255]], np.uint8)))


def test_float_tiff_is_converted_as_pillow_converts_it() -> None:
    samples = np.array([[-3.0, 0.0, 100.6, 254.9, 300.0]], dtype=np.float32)
    info, pixels = decode_image(encode(Image.fromarray(samples), "TIFF"), LIMITS)
    assert info.mode == "F"
    np.testing.assert_array_equal(pixels, rgb(np.array([[0, 0, 100, 254, 255]], np.uint8)))


def palette_image() -> tuple[Image.Image, np.ndarray, np.ndarray]:
    indices = (np.arange(32 * 48).reshape(32, 48) % 7).astype(np.uint8)
    palette = np.array(
        [[255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30], [200, 100, 0], [9, 9, 9], [1, 2, 3]],
        np.uint8,
    )
    image = Image.frombytes("P", (48, 32), indices.tobytes())
    image.putpalette(palette.tobytes())
    return image, indices, palette


def test_palette_png_is_expanded_to_its_colours() -> None:
    image, indices, palette = palette_image()
    info, pixels = decode_image(encode(image, "PNG"), LIMITS)
    assert info.mode == "P"
    np.testing.assert_array_equal(pixels, palette[indices])


@pytest.mark.filterwarnings("error")  # Pillow warns when converting byte-wise palette alpha
def test_palette_png_with_transparency_keeps_its_colours() -> None:
    image, indices, palette = palette_image()
    data = encode(image, "PNG", transparency=bytes([0, 128, 255, 0]))
    with Image.open(io.BytesIO(data)) as check:
        assert isinstance(check.info["transparency"], bytes)
    info, pixels = decode_image(data, LIMITS)
    assert info.mode == "P"
    np.testing.assert_array_equal(pixels, palette[indices])


def test_png_with_alpha_is_converted_to_rgb() -> None:
    colours = pattern()
    alpha = np.zeros((32, 48, 1), np.uint8)  # fully transparent: colours must still be kept
    alpha[:16] = 128
    data = encode(Image.fromarray(np.concatenate([colours, alpha], axis=-1)), "PNG")
    info, pixels = decode_image(data, LIMITS)
    assert info.mode == "RGBA"
    np.testing.assert_array_equal(pixels, colours)


def test_grayscale_png_with_alpha_is_converted_to_rgb() -> None:
    gray = pattern()[..., 0]
    la = np.stack([gray, np.full_like(gray, 7)], axis=-1)
    info, pixels = decode_image(encode(Image.fromarray(la), "PNG"), LIMITS)
    assert info.mode == "LA"
    np.testing.assert_array_equal(pixels, rgb(gray))


def test_adobe_cmyk_jpeg_is_converted_to_rgb() -> None:
    cmyk_colours = [(0, 255, 255, 0), (255, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 255)]
    rgb_colours = [(255, 0, 0), (0, 255, 255), (255, 255, 255), (0, 0, 0)]
    image = Image.new("CMYK", (64, 16))
    for i, colour in enumerate(cmyk_colours):
        image.paste(colour, (16 * i, 0, 16 * i + 16, 16))
    data = encode(image, "JPEG", quality=95)
    assert b"Adobe" in data  # libjpeg stores CMYK inverted and says so in an APP14 marker

    info, pixels = decode_image(data, LIMITS)
    assert info.mode == "CMYK"
    for i, expected in enumerate(rgb_colours):
        block = pixels[4:12, 16 * i + 4 : 16 * i + 12].astype(int)
        assert np.abs(block - expected).max() <= 8, (expected, block[0, 0])


def test_lab_tiff_is_unsupported() -> None:
    data = encode(Image.new("LAB", (8, 8), (50, 0, 0)), "TIFF")
    with pytest.raises(UnsupportedImage, match="mode LAB"):
        inspect_image(data, LIMITS)
