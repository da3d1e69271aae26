"""The resize (libvips, after orientation-free decoding) gives the pixels of the
straightforward path within a few levels.

The reference: decode with decode_image(min_size=...) (libjpeg-turbo, DCT-scaled,
oriented, or Pillow for other formats), then Image.fromarray and one Pillow BILINEAR resize
(antialiased, as libvips' linear kernel). The images are real: noise, shading and
hard-edged shapes encoded by Pillow (and the benchmark's 12 MP photo). The two libraries
place their filter taps and treat the image edges slightly differently, so the comparison
allows a small mean difference and a bounded worst sample (assert_close); a wrong
orientation, size or scale differs by tens of levels on these images.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pyvips
import simplejpeg
from PIL import Image

from gateway.imaging import resize
from gateway.imaging.decode import decode_image, decode_stored
from gateway.imaging.errors import CorruptImage, EmptyImage, ImageTooLarge
from gateway.imaging.header import ImageLimits, inspect_image
from gateway.imaging.resize import decode_to_size, decode_within, fit_within
from tests.support.pictures import EXIF_TRANSPOSE as TRANSPOSE  # Pillow's, independent of ours
from tests.support.pictures import encoded, scene

LIMITS = ImageLimits(max_bytes=64 * 2**20, max_pixels=50_000_000)
BILINEAR = Image.Resampling.BILINEAR
ROOT = Path(__file__).resolve().parents[2]
PHOTO_12MP = ROOT / "bench" / "images" / "photo_4032x3024.jpg"


# --- images -------------------------------------------------------------------------------


def jpeg(width: int, height: int, orientation: int = 1, **options: Any) -> bytes:
    return encoded(width, height, "JPEG", orientation, **{"quality": 90, **options})


def damaged_jpeg(width: int, height: int, orientation: int) -> bytes:
    """Stray bytes before the scan: libjpeg-turbo's strict mode refuses it, Pillow decodes
    it (in full: no DCT scaling)."""
    data = jpeg(width, height, orientation)
    scan = data.index(b"\xff\xda")
    return data[:scan] + b"\x00\x01\x02" + data[scan:]


# --- the reference ------------------------------------------------------------------------


def old_decode_to_size(data: bytes, size: tuple[int, int]) -> np.ndarray:
    _, pixels = decode_image(data, LIMITS, min_size=size)
    if pixels.shape[:2] == (size[1], size[0]):
        return pixels
    return np.asarray(Image.fromarray(np.ascontiguousarray(pixels)).resize(size, BILINEAR))


def old_decode_within(data: bytes, max_side: int) -> np.ndarray:
    info = inspect_image(data, LIMITS)
    size = fit_within(info.width, info.height, max_side)
    if size == (info.width, info.height):
        return decode_image(data, LIMITS)[1]
    return old_decode_to_size(data, size)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.uint8
    assert got.shape == want.shape
    differ = int(np.count_nonzero(got != want))
    assert differ == 0, f"{differ} samples differ (max {np.abs(got.astype(int) - want).max()})"


# Measured over the 277 comparisons below (outputs of at least 48 pixels a side; collected by
# hand on 2026-11-23 with a counter in assert_close): the mean
# difference is 0.13 levels (median), 0.68 at worst, and at least 99.79 % of the samples are
# within NEAR levels (the largest single difference 22); the rest are at the edges, where
# libvips repeats the edge pixels and Pillow narrows the filter. A wrong
# orientation, size or filter differs by tens of levels on average on these images.
MEAN_MAX = 1.0
NEAR = 8
NEAR_SHARE = 0.995


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.uint8
    assert got.shape == want.shape
    difference = np.abs(got.astype(np.int16) - want.astype(np.int16))
    mean = float(difference.mean())
    near = float(np.mean(difference <= NEAR))
    assert mean <= MEAN_MAX, f"mean difference {mean:.3f} levels"
    assert near >= NEAR_SHARE, f"only {near:.5f} of the samples within {NEAR} levels"


def test_the_reference_decodes_dct_scaled_jpegs_as_libjpeg_turbo_and_pillow_orient_them() -> None:
    # Independent of gateway.imaging.decode: simplejpeg at 1/2 scale, then Pillow's transpose.
    data = jpeg(3000, 2000, orientation=6)
    stored = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=1500, min_height=1000)
    assert stored.shape == (1000, 1500, 3)
    shown = np.asarray(Image.fromarray(stored).transpose(TRANSPOSE[6]))
    _, pixels = decode_image(data, LIMITS, min_size=(683, 1024))
    assert_same(pixels, shown)


# --- close to the reference -------------------------------------------------------


@pytest.mark.parametrize("max_side", [1024, 640, 300])
def test_12_megapixel_photo_within_a_side(max_side: int) -> None:
    data = PHOTO_12MP.read_bytes()
    info, pixels = decode_within(data, LIMITS, max_side)
    assert (info.width, info.height) == (4032, 3024)
    assert_close(pixels, old_decode_within(data, max_side))


@pytest.mark.parametrize("size", [(640, 640), (300, 500), (1024, 1024), (2016, 1000)])
def test_12_megapixel_photo_to_a_fixed_size(size: tuple[int, int]) -> None:
    data = PHOTO_12MP.read_bytes()
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_close(pixels, old_decode_to_size(data, size))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_within_a_side(orientation: int) -> None:
    data = jpeg(3000, 2000, orientation)
    info, pixels = decode_within(data, LIMITS, 1024)
    assert (info.width, info.height) == ((2000, 3000) if orientation >= 5 else (3000, 2000))
    assert_close(pixels, old_decode_within(data, 1024))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("size", [(640, 640), (900, 500), (1800, 2400)])
def test_every_exif_orientation_to_a_fixed_size(orientation: int, size: tuple[int, int]) -> None:
    data = jpeg(3000, 2000, orientation)
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_close(pixels, old_decode_to_size(data, size))


# name -> (encoded image, whether libjpeg-turbo decodes it rather than Pillow)
VARIANTS = {
    "grayscale JPEG": (lambda: jpeg(3000, 2000, mode="L"), True),
    "grayscale JPEG, orientation 6": (lambda: jpeg(3000, 2000, 6, mode="L"), True),
    "progressive JPEG, orientation 8": (lambda: jpeg(3000, 2000, 8, progressive=True), True),
    "4:4:4 JPEG, orientation 3": (lambda: jpeg(3000, 2000, 3, subsampling=0), True),
    "CMYK JPEG": (lambda: jpeg(1600, 1200, mode="CMYK"), False),
    "CMYK JPEG, orientation 5": (lambda: jpeg(1600, 1200, 5, mode="CMYK"), False),
    "damaged JPEG, orientation 6": (lambda: damaged_jpeg(3000, 2000, 6), False),
    "PNG": (lambda: encoded(1600, 1200, "PNG", compress_level=1), False),
    "PNG, orientation 2": (lambda: encoded(1600, 1200, "PNG", 2, compress_level=1), False),
    "PNG, orientation 7": (lambda: encoded(1600, 1200, "PNG", 7, compress_level=1), False),
    "grayscale PNG, orientation 6": (
        lambda: encoded(1600, 1200, "PNG", 6, mode="L", compress_level=1),
        False,
    ),
    "TIFF, orientation 6 (Pillow turns it)": (lambda: encoded(1600, 1200, "TIFF", 6), False),
    "WebP, orientation 8": (lambda: encoded(1600, 1200, "WEBP", 8, quality=90, method=0), False),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_every_decoder_path(name: str) -> None:
    make, fast = VARIANTS[name]
    data = make()
    _, stored, _ = decode_stored(data, LIMITS, (1024, 1024))
    assert isinstance(stored, np.ndarray) == fast
    _, pixels = decode_within(data, LIMITS, 1024)
    assert_close(pixels, old_decode_within(data, 1024))
    _, pixels = decode_to_size(data, LIMITS, (700, 900))
    assert_close(pixels, old_decode_to_size(data, (700, 900)))


@pytest.mark.parametrize("orientation", [1, 3, 6, 7])
@pytest.mark.parametrize(
    "size", [(224, 224), (300, 200), (96, 300)], ids=lambda size: "x".join(map(str, size))
)
def test_small_images(orientation: int, size: tuple[int, int]) -> None:
    data = jpeg(480, 360, orientation)
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_close(pixels, old_decode_to_size(data, size))
    _, pixels = decode_within(data, LIMITS, max(size))
    assert_close(pixels, old_decode_within(data, max(size)))


@pytest.mark.parametrize("orientation", [1, 6])
def test_upscaling_to_a_large_fixed_size(orientation: int) -> None:
    data = jpeg(320, 240, orientation)
    _, pixels = decode_to_size(data, LIMITS, (800, 700))
    assert_close(pixels, old_decode_to_size(data, (800, 700)))


@pytest.mark.parametrize("size", [(3000, 700), (900, 2000)], ids=["width kept", "height kept"])
def test_a_fixed_size_that_keeps_one_side(size: tuple[int, int]) -> None:
    data = jpeg(3000, 2000)
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_close(pixels, old_decode_to_size(data, size))


def test_an_image_already_at_the_size_is_decoded_as_before() -> None:
    data = jpeg(640, 480, 6)
    info, pixels = decode_to_size(data, LIMITS, (480, 640))
    assert_same(pixels, decode_image(data, LIMITS)[1])
    info, pixels = decode_within(data, LIMITS, 640)
    assert (info.width, info.height) == (480, 640)
    assert_same(pixels, decode_image(data, LIMITS)[1])


def test_a_dct_scale_that_lands_on_the_size_needs_no_resize() -> None:
    data = jpeg(3000, 2000, 6)
    _, pixels = decode_to_size(data, LIMITS, (500, 750))  # exactly 1/4 of 2000x3000
    assert_same(pixels, old_decode_to_size(data, (500, 750)))


@pytest.mark.parametrize("contiguous", [True, False])
def test_resize_of_decoded_pixels(contiguous: bool) -> None:
    pixels = np.asarray(scene(1500, 1100))
    if not contiguous:
        pixels = pixels[::-1, 100:]
    got = resize.resize(pixels, 1000, 700)
    want = np.asarray(Image.fromarray(np.ascontiguousarray(pixels)).resize((1000, 700), BILINEAR))
    assert_close(got, want)
    assert resize.resize(pixels, pixels.shape[1], pixels.shape[0]) is pixels


def test_random_sizes_and_orientations() -> None:
    """Many geometries, down and up, both kinds of decoded pixels (array and Pillow image)."""
    rng = random.Random(11)
    for case in range(240):
        height, width = rng.randint(2, 500), rng.randint(2, 500)
        # Shading plus noise (pure noise has no signal a resize keeps: every filter's
        # result is then mostly its own rounding).
        stored = np.asarray(scene(width, height, seed=case % 7))
        orientation = case % 8 + 1
        shown = Image.fromarray(stored)
        if orientation in TRANSPOSE:
            shown = shown.transpose(TRANSPOSE[orientation])
        if case % 3 == 0:
            size = fit_within(*shown.size, rng.randint(1, max(shown.size)))
        else:
            size = rng.randint(1, 600), rng.randint(1, 600)
        source: np.ndarray | Image.Image = stored if case % 2 else Image.fromarray(stored)
        got = resize._resize_stored(source, orientation, *size)
        want = np.asarray(shown.resize(size, BILINEAR))
        assert got.shape == want.shape
        if min(size) >= 48:
            assert_close(got, want)
        elif min(size) >= 8:
            # Tens of pixels: the edges, where libvips repeats the edge pixels and Pillow
            # narrows the filter, are a large part of the image (a wrong orientation still
            # differs by tens of levels). Below 8 pixels a side only the size is compared.
            assert np.abs(got.astype(np.int16) - want).mean() <= 3.0


@pytest.mark.parametrize(
    ("stored", "size"),
    [((1, 1), (50, 40)), ((4000, 1), (100, 1)), ((1, 3000), (1, 224)), ((640, 480), (1, 1))],
)
def test_lines_and_single_pixels(stored: tuple[int, int], size: tuple[int, int]) -> None:
    pixels = np.full((stored[1], stored[0], 3), (10, 200, 90), np.uint8)
    got = resize.resize(pixels, *size)
    assert got.shape == (size[1], size[0], 3)
    assert (got == (10, 200, 90)).all()  # a flat colour stays that colour at any scale


# --- libvips ------------------------------------------------------------------------------


def test_libvips_loads_no_encoded_bytes() -> None:
    """Callers' bytes go to libjpeg-turbo and Pillow only: libvips' loaders are blocked."""
    vips = resize._vips()
    with pytest.raises(pyvips.Error):
        vips.Image.new_from_buffer(jpeg(64, 48), "")


def test_libvips_is_loaded_by_the_first_resize_only() -> None:
    """A gateway that never resizes (models taking images as they come) never maps libvips
    (about 9 MiB per process)."""
    code = "import sys, gateway.app; assert 'pyvips' not in sys.modules, 'imported at startup'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_libvips_uses_the_decode_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not libvips' default (every processor the process may run on, which in a container
    with a CPU quota can be the node's): the gateway's decode threads, set from the CPU limit."""
    vips = resize._vips()
    before = vips.concurrency_get()
    monkeypatch.setattr(resize, "_threads", resize._threads)
    try:
        resize.use_threads(3)
        assert vips.concurrency_get() == 3
        _, pixels = decode_within(jpeg(3000, 2000), LIMITS, 1024)
        assert pixels.shape == (683, 1024, 3)
    finally:
        vips.concurrency_set(before)


def test_32_threads_at_once_get_the_single_thread_result() -> None:
    samples = [
        (PHOTO_12MP.read_bytes(), 1024),
        (jpeg(3000, 2000, 6), 1024),
        (jpeg(3000, 2000, 3), 800),
        (encoded(1600, 1200, "PNG", 8, compress_level=1), 1000),
    ]
    expected = [decode_within(data, LIMITS, side)[1] for data, side in samples]
    start = threading.Barrier(32)

    def one(index: int) -> np.ndarray:
        data, side = samples[index % len(samples)]
        start.wait()
        return decode_within(data, LIMITS, side)[1]

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(one, range(32)))
    for index, pixels in enumerate(results):
        assert_same(pixels, expected[index % len(samples)])
    for (data, side), pixels in zip(samples, expected, strict=True):
        assert_close(pixels, old_decode_within(data, side))


def test_decoded_pixels_are_read_only() -> None:
    _, pixels = decode_within(jpeg(3000, 2000, 6), LIMITS, 1024)
    assert not pixels.flags.writeable
    assert pixels.flags.c_contiguous


def test_errors_are_the_decoders() -> None:
    data = jpeg(640, 480)
    with pytest.raises(CorruptImage):
        decode_within(data[: len(data) // 2], LIMITS, 100)
    with pytest.raises(ImageTooLarge):
        decode_to_size(data, ImageLimits(max_bytes=100, max_pixels=10**6), (100, 100))
    with pytest.raises(EmptyImage):
        decode_within(b"", LIMITS, 100)
