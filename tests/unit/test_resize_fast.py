"""The fast resize gives exactly the pixels of the straightforward one.

The reference is the gateway's code before bands and resizing before orientation: decode with
images.decode_image(min_size=...) (libjpeg-turbo, DCT-scaled, oriented, or Pillow for other
formats), then Image.fromarray and one Pillow BILINEAR resize. The images are real: noise,
shading and hard-edged shapes encoded by Pillow (and the benchmark's 12 MP photo), and every
comparison is exact.
"""

from __future__ import annotations

import functools
import io
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from PIL import ExifTags, Image, ImageDraw

from gateway.imaging import images, resize
from gateway.imaging.images import ImageLimits, decode_image, decode_stored, inspect_image
from gateway.imaging.resize import decode_to_size, decode_within, fit_within

LIMITS = ImageLimits(max_bytes=64 * 2**20, max_pixels=50_000_000)
BILINEAR = Image.Resampling.BILINEAR
PHOTO_12MP = Path(__file__).resolve().parents[2] / "bench" / "images" / "photo_4032x3024.jpg"
# Pillow's transposes for EXIF orientations (as ImageOps.exif_transpose).
TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


@pytest.fixture(params=[1, 2, 4], ids=lambda n: f"{n}bands")
def bands(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Resize with this many threads, whatever this machine has (1: in one piece)."""
    monkeypatch.setattr(resize, "_BANDS", request.param)
    return int(request.param)


# --- images -------------------------------------------------------------------------------


@functools.cache
def scene(width: int, height: int, seed: int = 0) -> Image.Image:
    """Shading, sensor-like noise and hard-edged shapes: any resampling difference shows."""
    rng = np.random.default_rng(seed)
    y, x = np.ogrid[0:height, 0:width]
    shading = np.empty((height, width, 3), np.int16)
    shading[..., 0] = x * 255 // max(width - 1, 1)
    shading[..., 1] = y * 255 // max(height - 1, 1)
    shading[..., 2] = (x + 2 * y) % 256
    shading += rng.integers(-40, 41, (height, width, 3), dtype=np.int16)
    image = Image.fromarray(np.clip(shading, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        left, top = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = (left, top, left + width // 6, top + height // 5)
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)(box, fill=colour)
    return image


def exif(orientation: int) -> Image.Exif:
    tags = Image.Exif()
    tags[ExifTags.Base.Orientation] = orientation
    return tags


@functools.cache
def encoded(
    width: int,
    height: int,
    fmt: str = "JPEG",
    orientation: int = 1,
    mode: str = "RGB",
    **options: Any,
) -> bytes:
    image = scene(width, height).convert(mode)
    out = io.BytesIO()
    if orientation != 1:
        options["exif"] = exif(orientation)
    image.save(out, fmt, **options)
    return out.getvalue()


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


def test_the_reference_decodes_dct_scaled_jpegs_as_libjpeg_turbo_and_pillow_orient_them() -> None:
    # Independent of images.py: simplejpeg at 1/2 scale, then Pillow's transpose.
    data = jpeg(3000, 2000, orientation=6)
    stored = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=1500, min_height=1000)
    assert stored.shape == (1000, 1500, 3)
    shown = np.asarray(Image.fromarray(stored).transpose(TRANSPOSE[6]))
    _, pixels = decode_image(data, LIMITS, min_size=(683, 1024))
    assert_same(pixels, shown)


# --- bit-identical to the reference -------------------------------------------------------


@pytest.mark.parametrize("max_side", [1024, 640, 300])
def test_12_megapixel_photo_within_a_side(bands: int, max_side: int) -> None:
    data = PHOTO_12MP.read_bytes()
    info, pixels = decode_within(data, LIMITS, max_side)
    assert (info.width, info.height) == (4032, 3024)
    assert_same(pixels, old_decode_within(data, max_side))


@pytest.mark.parametrize("size", [(640, 640), (300, 500), (1024, 1024), (2016, 1000)])
def test_12_megapixel_photo_to_a_fixed_size(bands: int, size: tuple[int, int]) -> None:
    data = PHOTO_12MP.read_bytes()
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_same(pixels, old_decode_to_size(data, size))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_within_a_side(bands: int, orientation: int) -> None:
    data = jpeg(3000, 2000, orientation)
    info, pixels = decode_within(data, LIMITS, 1024)
    assert (info.width, info.height) == ((2000, 3000) if orientation >= 5 else (3000, 2000))
    assert_same(pixels, old_decode_within(data, 1024))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("size", [(640, 640), (900, 500), (1800, 2400)])
def test_every_exif_orientation_to_a_fixed_size(
    bands: int, orientation: int, size: tuple[int, int]
) -> None:
    data = jpeg(3000, 2000, orientation)
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_same(pixels, old_decode_to_size(data, size))


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
def test_every_decoder_path(bands: int, name: str) -> None:
    make, fast = VARIANTS[name]
    data = make()
    _, stored, _ = decode_stored(data, LIMITS, (1024, 1024))
    assert isinstance(stored, np.ndarray) == fast
    _, pixels = decode_within(data, LIMITS, 1024)
    assert_same(pixels, old_decode_within(data, 1024))
    _, pixels = decode_to_size(data, LIMITS, (700, 900))
    assert_same(pixels, old_decode_to_size(data, (700, 900)))


@pytest.mark.parametrize("orientation", [1, 3, 6, 7])
@pytest.mark.parametrize(
    "size", [(224, 224), (300, 200), (96, 300)], ids=lambda size: "x".join(map(str, size))
)
def test_small_images_below_the_band_threshold(orientation: int, size: tuple[int, int]) -> None:
    assert max(480 * 360, size[0] * size[1]) < resize._BAND_MIN_PIXELS
    data = jpeg(480, 360, orientation)
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_same(pixels, old_decode_to_size(data, size))
    _, pixels = decode_within(data, LIMITS, max(size))
    assert_same(pixels, old_decode_within(data, max(size)))


def test_a_large_png_to_a_small_size_is_resized_in_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    # No DCT scaling for PNG: the first pass reads every input pixel, so it is worth bands.
    monkeypatch.setattr(resize, "_BANDS", 2)
    calls = []
    run = resize._run

    def counting(tasks: list[Any]) -> None:
        calls.append(len(tasks))
        run(tasks)

    monkeypatch.setattr(resize, "_run", counting)
    data = encoded(1600, 1200, "PNG", 6, compress_level=1)
    _, pixels = decode_to_size(data, LIMITS, (224, 224))
    assert calls == [2]
    assert_same(pixels, old_decode_to_size(data, (224, 224)))


@pytest.mark.parametrize("orientation", [1, 6])
def test_upscaling_to_a_large_fixed_size(bands: int, orientation: int) -> None:
    data = jpeg(320, 240, orientation)
    _, pixels = decode_to_size(data, LIMITS, (800, 700))
    assert_same(pixels, old_decode_to_size(data, (800, 700)))


@pytest.mark.parametrize("size", [(3000, 700), (900, 2000)], ids=["width kept", "height kept"])
def test_a_fixed_size_that_keeps_one_side(bands: int, size: tuple[int, int]) -> None:
    data = jpeg(3000, 2000)
    _, pixels = decode_to_size(data, LIMITS, size)
    assert_same(pixels, old_decode_to_size(data, size))


def test_an_image_already_at_the_size_is_decoded_as_before() -> None:
    data = jpeg(640, 480, 6)
    info, pixels = decode_to_size(data, LIMITS, (480, 640))
    assert_same(pixels, decode_image(data, LIMITS)[1])
    info, pixels = decode_within(data, LIMITS, 640)
    assert (info.width, info.height) == (480, 640)
    assert_same(pixels, decode_image(data, LIMITS)[1])


def test_a_dct_scale_that_lands_on_the_size_needs_no_resize(bands: int) -> None:
    data = jpeg(3000, 2000, 6)
    _, pixels = decode_to_size(data, LIMITS, (500, 750))  # exactly 1/4 of 2000x3000
    assert_same(pixels, old_decode_to_size(data, (500, 750)))


@pytest.mark.parametrize("contiguous", [True, False])
def test_resize_of_decoded_pixels(bands: int, contiguous: bool) -> None:
    pixels = np.asarray(scene(1500, 1100))
    if not contiguous:
        pixels = pixels[::-1, 100:]
    got = resize.resize(pixels, 1000, 700)
    want = np.asarray(Image.fromarray(np.ascontiguousarray(pixels)).resize((1000, 700), BILINEAR))
    assert_same(got, want)
    assert resize.resize(pixels, pixels.shape[1], pixels.shape[0]) is pixels


def test_random_sizes_orientations_and_band_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many geometries, every band forced (no size threshold), both kinds of decoded pixels."""
    monkeypatch.setattr(resize, "_BAND_MIN_PIXELS", 0)
    rng = random.Random(11)
    noise = np.random.default_rng(11)
    for case in range(240):
        monkeypatch.setattr(resize, "_BANDS", 2 + case % 3)
        stored = noise.integers(0, 256, (rng.randint(2, 500), rng.randint(2, 500), 3), np.uint8)
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
        assert_same(got, np.asarray(shown.resize(size, BILINEAR)))


# --- why the fast path is built as it is --------------------------------------------------


@pytest.mark.parametrize(
    ("size", "out", "horizontal_first"),
    [
        ((2016, 1512), (1024, 768), True),
        ((1512, 2016), (768, 1024), True),
        ((1074, 910), (200, 300), True),
        ((500, 1000), (450, 200), False),  # the height shrinks far more than the width
        ((100, 300), (300, 200), False),  # wider, shorter
    ],
)
def test_the_pass_order_is_the_one_pillow_uses(
    size: tuple[int, int], out: tuple[int, int], horizontal_first: bool
) -> None:
    assert resize._horizontal_first(*size, *out) is horizontal_first
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (*size[::-1], 3), np.uint8))
    whole = np.asarray(image.resize(out, BILINEAR))
    across = image.resize((out[0], size[1]), BILINEAR)
    down = image.resize((size[0], out[1]), BILINEAR)
    modelled = across.resize(out, BILINEAR) if horizontal_first else down.resize(out, BILINEAR)
    other = down.resize(out, BILINEAR) if horizontal_first else across.resize(out, BILINEAR)
    assert_same(np.asarray(modelled), whole)
    assert not np.array_equal(np.asarray(other), whole)  # the order does matter


def test_a_band_edge_that_is_not_exact_as_a_float_changes_pixels() -> None:
    """Why bands are only cut where the coefficients match: 1512 rows to 767 cut after 383
    puts the box edge at 755.014..., which Pillow rounds to a 32-bit float."""
    image = Image.fromarray(np.random.default_rng(4).integers(0, 256, (1512, 300, 3), np.uint8))
    whole = np.asarray(image.resize((300, 767), BILINEAR))
    edge = 383 * 1512 / 767
    lower = np.asarray(image.resize((300, 767 - 383), BILINEAR, box=(0, edge, 300, 1512)))
    assert not np.array_equal(lower, whole[383:])
    assert all(band.start != 383 for band in resize._bands(1512, 767, 2) or ())


@pytest.mark.parametrize(
    ("stored", "target"),
    [
        ((2016, 1512), (1024, 768)),  # 12 MP at 1/2, landscape
        ((1512, 2016), (768, 1024)),  # and portrait
        ((1920, 1080), (1024, 576)),  # 16:9
        ((1500, 1000), (1024, 683)),  # 3:2 at 1/2
        ((1008, 756), (640, 640)),  # 12 MP at 1/4 to a square model input
    ],
)
def test_common_sizes_are_resized_in_bands(
    monkeypatch: pytest.MonkeyPatch, stored: tuple[int, int], target: tuple[int, int]
) -> None:
    monkeypatch.setattr(resize, "_BANDS", 2)
    lines = {resize._COLUMNS: (stored[0], target[0]), resize._ROWS: (stored[1], target[1])}
    split = resize._split(lines, target[0] * target[1])
    assert split is not None
    axis, cut = split
    sizes = [band.stop - band.start for band in cut]
    assert sum(sizes) == lines[axis][1] and min(sizes) > 0.3 * lines[axis][1]


# --- threads ------------------------------------------------------------------------------


def test_32_threads_at_once_get_the_single_thread_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resize, "_BANDS", 2)
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
        assert_same(pixels, old_decode_within(data, side))


def test_a_busy_helper_pool_does_not_hold_up_a_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resize, "_BANDS", 4)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resize-test")
    monkeypatch.setattr(resize, "_pool", pool)
    release = threading.Event()
    pool.submit(release.wait)  # the only helper is stuck until the end of the test
    data = jpeg(3000, 2000, 6)
    result: dict[str, np.ndarray] = {}

    def call() -> None:
        result["pixels"] = decode_within(data, LIMITS, 1024)[1]

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=60)
    try:
        assert not caller.is_alive(), "the caller waited for the busy helper"
        assert_same(result["pixels"], old_decode_within(data, 1024))
    finally:
        release.set()
        pool.shutdown()


def test_a_failing_band_fails_the_call() -> None:
    ran = []

    def fails() -> None:
        raise MemoryError("band")

    with pytest.raises(MemoryError, match="band"):
        resize._run([lambda: ran.append(1), fails])  # on a helper or taken back
    with pytest.raises(MemoryError, match="band"):
        resize._run([fails, lambda: ran.append(2)])
    assert ran[0] == 1


def test_helper_threads_are_named_and_shared() -> None:
    pool = resize._helpers()
    assert pool is resize._helpers()
    assert pool.submit(lambda: threading.current_thread().name).result().startswith("resize")
    assert 1 <= resize._HELPERS <= 3


def test_decoded_pixels_are_read_only(bands: int) -> None:
    _, pixels = decode_within(jpeg(3000, 2000, 6), LIMITS, 1024)
    assert not pixels.flags.writeable
    assert pixels.flags.c_contiguous


def test_errors_are_the_decoders(bands: int) -> None:
    data = jpeg(640, 480)
    with pytest.raises(images.CorruptImage):
        decode_within(data[: len(data) // 2], LIMITS, 100)
    with pytest.raises(images.ImageTooLarge):
        decode_to_size(data, ImageLimits(max_bytes=100, max_pixels=10**6), (100, 100))
    with pytest.raises(images.EmptyImage):
        decode_within(b"", LIMITS, 100)
