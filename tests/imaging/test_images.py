"""Tests for gateway.images, on real images built here with Pillow and numpy."""

from __future__ import annotations

import io
import struct
import time
import tracemalloc
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from PIL import ExifTags, Image, ImageFile, ImageOps

from gateway.imaging import decode
from gateway.imaging.decode import decode_image, decode_stored, encode_png
from gateway.imaging.errors import (
    CorruptImage,
    EmptyImage,
    ImageError,
    ImageTooLarge,
    UnsupportedImage,
)
from gateway.imaging.header import ImageInfo, ImageLimits, inspect_image, model_can_decode
from gateway.imaging.orientation import orient_box

LIMITS = ImageLimits(max_bytes=20 * 2**20, max_pixels=50_000_000)
PILLOW_DEFAULT_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3

# name -> (Pillow format, save options)
Savers = dict[str, tuple[str, dict[str, Any]]]
LOSSLESS: Savers = {
    "PNG": ("PNG", {}),
    "BMP": ("BMP", {}),
    "TIFF": ("TIFF", {}),
    "TIFF deflate": ("TIFF", {"compression": "tiff_deflate"}),  # decoded through libtiff
    "WebP lossless": ("WEBP", {"lossless": True}),
}
LOSSY: Savers = {
    "JPEG": ("JPEG", {"quality": 95, "subsampling": 0}),
    "WebP": ("WEBP", {"quality": 95}),
}
WITH_EXIF: Savers = {
    "PNG": ("PNG", {}),
    "JPEG": ("JPEG", {"quality": 90}),
    "WebP": ("WEBP", {"lossless": True}),
    "TIFF": ("TIFF", {}),
    "TIFF deflate": ("TIFF", {"compression": "tiff_deflate"}),
}


def pattern(width: int = 48, height: int = 32) -> np.ndarray:
    """Smooth RGB pattern that changes under every flip and rotation."""
    y, x = np.mgrid[0:height, 0:width]
    red = x * 255 // (width - 1)
    green = y * 255 // (height - 1)
    blue = 128 + 2 * (x - y)
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def exif_with(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    return exif


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def raw_png(width: int, height: int, bit_depth: int, color_type: int, rows: list[bytes]) -> bytes:
    """A PNG written by hand, for layouts Pillow cannot save (16-bit RGB, lying headers)."""
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    scanlines = b"".join(b"\x00" + row for row in rows)  # filter type 0 on every row
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(scanlines))
        + png_chunk(b"IEND", b"")
    )


def png_header_claiming(width: int, height: int) -> bytes:
    """A valid PNG header for a huge RGB image, followed by a few bytes of pixel data."""
    return raw_png(width, height, 8, 2, [b"\x00" * 300])


def pillow_displayed(data: bytes) -> np.ndarray:
    """The image as Pillow's exif_transpose shows it: the reference for orientation."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


def rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., np.newaxis], 3, axis=-1)


# --- formats ----------------------------------------------------------------------------


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


# --- EXIF orientation -------------------------------------------------------------------


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("name", WITH_EXIF)
def test_exif_orientation_gives_the_image_as_displayed(name: str, orientation: int) -> None:
    fmt, options = WITH_EXIF[name]
    data = encode(Image.fromarray(pattern(48, 32)), fmt, exif=exif_with(orientation), **options)
    info, pixels = decode_image(data, LIMITS)
    assert info.orientation == orientation
    assert (info.stored_width, info.stored_height) == (48, 32)
    assert (info.width, info.height) == ((32, 48) if orientation >= 5 else (48, 32))
    assert inspect_image(data, LIMITS) == info
    np.testing.assert_array_equal(pixels, pillow_displayed(data))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_box_maps_a_stored_box_onto_the_box_seen_in_the_displayed_image(
    orientation: int,
) -> None:
    height, width = 24, 40
    top, left, bottom, right = 3, 5, 10, 17  # half-open pixel edges
    stored = np.zeros((height, width, 3), np.uint8)
    stored[top:bottom, left:right] = 255
    data = encode(Image.fromarray(stored), "PNG", exif=exif_with(orientation))

    _, displayed = decode_image(data, LIMITS)
    rows, cols = np.nonzero(displayed[..., 0])
    seen = (rows.min(), cols.min(), rows.max() + 1, cols.max() + 1)

    ymin, xmin, ymax, xmax = orient_box(
        (top / height, left / width, bottom / height, right / width), orientation
    )
    shown_height, shown_width = displayed.shape[:2]
    mapped = (ymin * shown_height, xmin * shown_width, ymax * shown_height, xmax * shown_width)
    assert mapped == pytest.approx(seen, abs=1e-9)


def test_concurrent_decodes_in_a_thread_pool_do_not_interfere() -> None:
    samples = [
        encode(Image.fromarray(pattern()), fmt, exif=exif_with(orientation), **options)
        for fmt, options in WITH_EXIF.values()
        for orientation in (1, 3, 6)
    ] * 4
    expected = [pillow_displayed(data) for data in samples]
    with ThreadPoolExecutor(max_workers=8) as pool:
        decoded = list(pool.map(lambda data: decode_image(data, LIMITS)[1], samples))
    for pixels, want in zip(decoded, expected, strict=True):
        np.testing.assert_array_equal(pixels, want)


def test_orient_box_refuses_an_orientation_outside_1_to_8() -> None:
    with pytest.raises(ValueError, match=r"1\.\.8"):
        orient_box((0.1, 0.2, 0.3, 0.4), 9)


@pytest.mark.parametrize("orientation", [0, 9, 255])
def test_invalid_orientation_is_ignored(orientation: int) -> None:
    expected = pattern()
    data = encode(Image.fromarray(expected), "PNG", exif=exif_with(orientation))
    info, pixels = decode_image(data, LIMITS)
    assert info.orientation == 1
    np.testing.assert_array_equal(pixels, expected)


PILLOW_DAMAGE_WARNINGS = "ignore::UserWarning:PIL.TiffImagePlugin"  # Pillow's own, expected


@pytest.mark.filterwarnings(PILLOW_DAMAGE_WARNINGS)
def test_damaged_exif_block_is_ignored() -> None:
    jpeg = encode(Image.fromarray(pattern()), "JPEG", quality=95)
    # An APP1 Exif segment whose TIFF header points its first IFD far past the end.
    body = b"Exif\x00\x00MM\x00\x2a\x7f\xff\xff\xff"
    app1 = b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body
    data = jpeg[:2] + app1 + jpeg[2:]
    info, pixels = decode_image(data, LIMITS)
    assert info.orientation == 1
    assert pixels.shape == (32, 48, 3)


# --- modes --------------------------------------------------------------------------------


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


# --- limits -------------------------------------------------------------------------------


def test_image_over_the_byte_limit_is_refused() -> None:
    data = encode(Image.fromarray(pattern()), "PNG")
    limits = ImageLimits(max_bytes=len(data) - 1, max_pixels=LIMITS.max_pixels)
    for function in (inspect_image, decode_image):
        with pytest.raises(ImageTooLarge) as caught:
            function(data, limits)
        error = caught.value
        assert (error.limit, error.actual, error.maximum) == ("bytes", len(data), len(data) - 1)
        assert str(error).startswith(f"image is {len(data)} bytes; the limit is {len(data) - 1}")
        assert str(error).endswith("raise GATEWAY_MAX_IMAGE_BYTES")


def test_image_at_exactly_the_limits_is_accepted() -> None:
    data = encode(Image.fromarray(pattern(48, 32)), "PNG")
    _, pixels = decode_image(data, ImageLimits(max_bytes=len(data), max_pixels=48 * 32))
    assert pixels.shape == (32, 48, 3)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF"])
def test_image_over_the_pixel_limit_is_refused(fmt: str) -> None:
    data = encode(Image.fromarray(pattern(48, 32)), fmt)
    limits = ImageLimits(max_bytes=LIMITS.max_bytes, max_pixels=48 * 32 - 1)
    for function in (inspect_image, decode_image):
        with pytest.raises(ImageTooLarge) as caught:
            function(data, limits)
        error = caught.value
        assert (error.limit, error.actual, error.maximum) == ("pixels", 1536, 1535)
        assert str(error) == (
            "image is 48x32 pixels (1536 pixels); the limit is 1535 pixels: "
            "send a smaller image or raise GATEWAY_MAX_PIXELS"
        )


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_pixel_limit_is_checked_before_the_pixel_data_is_read(fmt: str) -> None:
    data = encode(Image.fromarray(pattern(320, 240)), fmt)
    truncated = data[: len(data) // 2]  # decoding would fail with CorruptImage
    limits = ImageLimits(max_bytes=LIMITS.max_bytes, max_pixels=100)
    with pytest.raises(ImageTooLarge):
        decode_image(truncated, limits)


def test_pixel_limit_message_speaks_megapixels_for_photos() -> None:
    with pytest.raises(ImageTooLarge) as caught:
        inspect_image(png_header_claiming(41000, 30000), LIMITS)
    assert str(caught.value) == (
        "image is 41000x30000 pixels (1230.0 megapixels); the limit is 50.0 megapixels: "
        "send a smaller image or raise GATEWAY_MAX_PIXELS"
    )


@pytest.mark.filterwarnings("error")
def test_png_header_claiming_100000x100000_is_refused_without_allocating() -> None:
    data = png_header_claiming(100_000, 100_000)
    tracemalloc.start()
    started = time.process_time()  # CPU time: other processes' load does not count
    try:
        for function in (inspect_image, decode_image):
            with pytest.raises(ImageTooLarge) as caught:
                function(data, LIMITS)
            assert caught.value.actual == 10**10
        elapsed = time.process_time() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5  # decoding 10 gigapixels would take minutes
    assert peak < 1_000_000  # 10 gigapixels of RGB would be 30 GB


@pytest.mark.filterwarnings("error")
def test_gif_whose_first_frame_outgrows_the_screen_is_refused_before_pillow_allocates() -> None:
    # 1x1 logical screen; the first frame is 20000x20000 and asks to be disposed to the
    # background, which makes Pillow allocate a frame-sized buffer while merely opening it.
    screen = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0, 0, 0)
    control = b"\x21\xf9\x04\x08\x00\x00\x00\x00"
    frame = b"\x2c" + struct.pack("<4HB", 0, 0, 20000, 20000, 0) + b"\x02\x02\x44\x01\x00"
    data = screen + control + frame + b"\x3b"
    with pytest.raises(ImageTooLarge) as caught:
        inspect_image(data, LIMITS)
    assert "20000x20000" in str(caught.value)


@pytest.mark.filterwarnings("error")
def test_webp_header_claiming_a_huge_canvas_is_refused_before_libwebp_allocates() -> None:
    vp8x = b"\x00\x00\x00\x00" + (16000 - 1).to_bytes(3, "little") * 2
    data = b"RIFF" + struct.pack("<I", 4 + 8 + len(vp8x)) + b"WEBPVP8X"
    data += struct.pack("<I", len(vp8x)) + vp8x
    with pytest.raises(ImageTooLarge) as caught:
        inspect_image(data, LIMITS)
    assert caught.value.actual == 16000 * 16000


@pytest.mark.filterwarnings("error")
def test_image_between_our_limit_and_pillows_is_refused_by_us_without_a_pillow_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PILLOW_DEFAULT_MAX_PIXELS)
    # 100 megapixels: over Pillow's warning threshold, under its error threshold.
    with pytest.raises(ImageTooLarge, match="10000x10000"):
        inspect_image(png_header_claiming(10_000, 10_000), LIMITS)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("fmt", ["JPEG with XMP", "PNG", "GIF", "BMP", "WEBP", "TIFF"])
def test_pillow_bomb_check_does_not_refuse_what_our_limit_allows(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # as if an operator raised our limit
    image = Image.fromarray(pattern(48, 32))
    if fmt == "JPEG with XMP":  # a JPEG whose header Pillow reads (a plain one never meets it)
        out = io.BytesIO()
        image.save(out, "JPEG", xmp=b'<x:xmpmeta xmlns:x="adobe:ns:meta/"/>')
        data = out.getvalue()
    else:
        data = encode(image, fmt)
    _, pixels = decode_image(data, ImageLimits(max_bytes=LIMITS.max_bytes, max_pixels=5000))
    assert pixels.shape == (32, 48, 3)
    assert Image.MAX_IMAGE_PIXELS == 5000


@pytest.mark.filterwarnings("error")
def test_plain_jpeg_is_decoded_without_pillow_so_its_bomb_check_never_meets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    opened: list[bytes] = []
    monkeypatch.setattr(decode, "open_image", lambda data, limits: opened.append(data))
    data = encode(Image.fromarray(pattern(48, 32)), "JPEG")
    _, pixels = decode_image(data, ImageLimits(max_bytes=LIMITS.max_bytes, max_pixels=5000))
    assert pixels.shape == (32, 48, 3)
    assert opened == [] and Image.MAX_IMAGE_PIXELS == 100


@pytest.mark.parametrize("ceiling", [None, 10**12])
def test_pillow_ceiling_is_never_lowered(
    ceiling: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", ceiling)
    decode_image(encode(Image.fromarray(pattern()), "PNG"), LIMITS)
    assert ceiling == Image.MAX_IMAGE_PIXELS


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ImageLimits(max_bytes=0, max_pixels=1)


# --- bad input ----------------------------------------------------------------------------


def test_empty_image_is_refused() -> None:
    for function in (inspect_image, decode_image):
        with pytest.raises(EmptyImage) as caught:
            function(b"", LIMITS)
        assert str(caught.value) == (
            "image is empty: set the request's image to the encoded image bytes"
        )


def test_random_bytes_are_an_unsupported_format() -> None:
    data = b"not an image" + np.random.default_rng(7).bytes(1000)
    with pytest.raises(UnsupportedImage) as caught:
        decode_image(data, LIMITS)
    assert str(caught.value).startswith(
        "image data could not be decoded as any supported format (JPEG, PNG, GIF, BMP, WebP, TIFF)"
    )


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic", "HEIF"),
        (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1", "AVIF"),
        (encode(Image.new("RGB", (16, 16)), "ICO"), "ICO"),
    ],
)
def test_well_known_unsupported_formats_are_named(data: bytes, name: str) -> None:
    with pytest.raises(UnsupportedImage, match=f"image format {name} is not supported"):
        inspect_image(data, LIMITS)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_image_passes_inspection_but_fails_decoding(fmt: str) -> None:
    data = encode(Image.fromarray(pattern(320, 240)), fmt)  # large enough to cut the pixels
    truncated = data[: len(data) // 2]
    assert inspect_image(truncated, LIMITS).format == fmt  # the header is intact
    with pytest.raises(CorruptImage, match=f"looks like {fmt} but could not be decoded"):
        decode_image(truncated, LIMITS)


def test_png_signature_followed_by_garbage_is_corrupt() -> None:
    with pytest.raises(CorruptImage, match="looks like PNG"):
        inspect_image(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10, LIMITS)


def test_truncated_images_are_never_loaded_leniently() -> None:
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


DAMAGEABLE: Savers = {**LOSSLESS, **LOSSY, "GIF": ("GIF", {})}


@pytest.mark.filterwarnings(PILLOW_DAMAGE_WARNINGS)
@pytest.mark.parametrize("name", DAMAGEABLE)
def test_damaged_images_raise_only_image_errors(name: str) -> None:
    fmt, options = DAMAGEABLE[name]
    data = encode(Image.fromarray(pattern()), fmt, **options)
    rng = np.random.default_rng(sum(name.encode()))
    damaged = [data[:cut] for cut in rng.integers(1, len(data), 15)]
    for _ in range(25):
        mutable = bytearray(data)
        for position in rng.integers(0, len(data), 3):
            mutable[position] = int(rng.integers(0, 256))
        damaged.append(bytes(mutable))
    for sample in damaged:
        try:
            _, pixels = decode_image(sample, LIMITS)
        except ImageError:
            continue
        assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3


# --- TF compatibility and transcoding -----------------------------------------------------


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


# --- decode_stored: the pixels before orientation, for resizing ---------------------------

# EXIF orientation -> Pillow's transpose (as ImageOps.exif_transpose).
EXIF_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def shown_from_stored(stored: np.ndarray | Image.Image, orientation: int) -> np.ndarray:
    image = stored if isinstance(stored, Image.Image) else Image.fromarray(stored)
    if orientation in EXIF_TRANSPOSE:
        image = image.transpose(EXIF_TRANSPOSE[orientation])
    return np.asarray(image)


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("name", WITH_EXIF)
def test_decode_stored_gives_the_pixels_as_stored_and_the_orientation_left_to_apply(
    name: str, orientation: int
) -> None:
    fmt, options = WITH_EXIF[name]
    data = encode(Image.fromarray(pattern(48, 32)), fmt, exif=exif_with(orientation), **options)
    info, stored, left = decode_stored(data, LIMITS, (48, 48))
    assert info == inspect_image(data, LIMITS)
    # libjpeg-turbo's array for JPEG, Pillow's image for the rest; Pillow's TIFF plugin
    # has turned the image already.
    assert isinstance(stored, np.ndarray) == (fmt == "JPEG")
    assert left == (1 if fmt == "TIFF" else orientation)
    np.testing.assert_array_equal(shown_from_stored(stored, left), decode_image(data, LIMITS)[1])


@pytest.mark.parametrize("orientation", [1, 6])
@pytest.mark.parametrize(
    ("min_size", "shape"),
    [((100, 75), (75, 100)), ((150, 100), (150, 200)), ((300, 300), (300, 400))],
)
def test_decode_stored_scales_jpegs_as_decode_image_does(
    orientation: int, min_size: tuple[int, int], shape: tuple[int, int]
) -> None:
    data = encode(Image.fromarray(pattern(400, 300)), "JPEG", exif=exif_with(orientation))
    # min_size is as shown: the 400x300 stored image shows as 300x400 with orientation 6.
    shown_min = min_size[::-1] if orientation >= 5 else min_size
    _, stored, left = decode_stored(data, LIMITS, shown_min)
    assert isinstance(stored, np.ndarray)
    assert stored.shape[:2] == shape  # 1/4, 1/2 or full size
    _, scaled = decode_image(data, LIMITS, min_size=shown_min)
    np.testing.assert_array_equal(shown_from_stored(stored, left), scaled)


def test_decode_stored_falls_back_to_pillow_for_a_jpeg_libjpeg_turbo_refuses() -> None:
    data = encode(Image.fromarray(pattern(320, 240)), "JPEG", exif=exif_with(6))
    scan = data.index(b"\xff\xda")
    damaged = data[:scan] + b"\x00\x01\x02" + data[scan:]  # stray bytes: a libjpeg warning
    _, stored, left = decode_stored(damaged, LIMITS, (60, 80))
    assert isinstance(stored, Image.Image)
    assert stored.size == (320, 240)  # Pillow decodes in full
    assert left == 6
    np.testing.assert_array_equal(shown_from_stored(stored, left), pillow_displayed(damaged))


def test_decode_stored_refuses_what_decode_image_refuses() -> None:
    jpeg = encode(Image.fromarray(pattern(320, 240)), "JPEG")
    with pytest.raises(EmptyImage):
        decode_stored(b"", LIMITS, (10, 10))
    with pytest.raises(ImageTooLarge):
        decode_stored(jpeg, ImageLimits(max_bytes=100, max_pixels=10**6), (10, 10))
    with pytest.raises(ImageTooLarge):
        decode_stored(jpeg, ImageLimits(max_bytes=10**6, max_pixels=1000), (10, 10))
    with pytest.raises(UnsupportedImage):
        decode_stored(b"not an image at all", LIMITS, (10, 10))
    with pytest.raises(CorruptImage, match="truncated or damaged"):
        decode_stored(jpeg[: len(jpeg) // 2], LIMITS, (10, 10))
    png = encode(Image.fromarray(pattern(320, 240)), "PNG")
    with pytest.raises(CorruptImage, match="looks like PNG"):
        decode_stored(png[: len(png) // 2], LIMITS, (10, 10))
