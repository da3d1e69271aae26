"""EXIF orientation (gateway.imaging.orientation, decode): every orientation gives the image as
displayed, boxes map from the stored to the displayed image, invalid or damaged EXIF is ignored,
and decode_stored gives the pixels as stored with the orientation left to apply (for resizing).
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from gateway.imaging.decode import decode_image, decode_stored
from gateway.imaging.errors import (
    CorruptImage,
    EmptyImage,
    ImageTooLarge,
    UnsupportedImage,
)
from gateway.imaging.header import ImageLimits, inspect_image
from gateway.imaging.orientation import orient_box
from tests.support.pictures import (
    EXIF_TRANSPOSE,
    LIMITS,
    PILLOW_DAMAGE_WARNINGS,
    WITH_EXIF,
    encode,
    exif_with,
    pattern,
    pillow_displayed,
)


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
