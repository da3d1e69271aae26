"""The limits read from the header before any pixel (gateway.imaging.header): bytes and pixels,
refused before Pillow or libwebp allocates, Pillow's own bomb check never lowering ours; and bad
input: empty, random, well-known unsupported formats, truncated and damaged files, each only
ever an ImageError.
"""

from __future__ import annotations

import io
import struct
import time
import tracemalloc

import numpy as np
import pytest
from PIL import Image, ImageFile

from gateway.imaging import decode
from gateway.imaging.decode import decode_image
from gateway.imaging.errors import (
    CorruptImage,
    EmptyImage,
    ImageError,
    ImageTooLarge,
    UnsupportedImage,
)
from gateway.imaging.header import ImageLimits, inspect_image
from tests.support.pictures import (
    LIMITS,
    LOSSLESS,
    LOSSY,
    PILLOW_DAMAGE_WARNINGS,
    PILLOW_DEFAULT_MAX_PIXELS,
    Savers,
    encode,
    pattern,
    png_header_claiming,
)


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
