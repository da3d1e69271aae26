"""Exact resizing (gateway.imaging.filters) gives what the library each filter names gives:
TensorFlow's tf.image.resize (bilinear, with and without antialias, and nearest) and
Pillow's Image.resize, on noisy images shrunk, enlarged and stretched; and a model config's
resize_filter reaches the pixels through decode_to_size / decode_within, EXIF orientation
first, as the exporters' pipelines (decode, ImageOps.exif_transpose, resize) do."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from gateway.imaging import filters
from gateway.imaging.header import ImageLimits
from gateway.imaging.resize import decode_to_size, decode_within
from tests.support.pictures import encoded

LIMITS = ImageLimits(max_bytes=64 * 2**20, max_pixels=50_000_000)
# (height, width) in -> (height, width) out: shrinking by 1.3x to 13x, enlarging, stretching
# one axis and squeezing the other, odd sizes, and the same size.
SIZES = [
    ((300, 400), (224, 224)),
    ((1200, 900), (224, 224)),
    ((3024, 4032), (224, 224)),
    ((100, 150), (224, 224)),
    ((240, 320), (320, 320)),
    ((7, 5), (3, 9)),
    ((500, 333), (256, 256)),
    ((224, 224), (224, 224)),
    ((1, 17), (4, 4)),
]
TF_METHODS = {
    "tf-bilinear": {"method": "bilinear"},
    "tf-bilinear-antialias": {"method": "bilinear", "antialias": True},
    "nearest": {"method": "nearest"},
}


def noise(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize("name", list(TF_METHODS))
@pytest.mark.parametrize(("before", "after"), SIZES)
def test_the_tf_filters_give_tf_image_resize(name, before, after):
    pixels = noise(*before)
    want = tf.image.resize(pixels, after, **TF_METHODS[name]).numpy()
    got = filters.resize_exact(pixels, after[1], after[0], name)
    assert got.shape == want.shape
    if name == "nearest":  # Pillow's NEAREST: the same samples as TF's nearest
        assert np.array_equal(got, want)
        return
    assert got.dtype == np.float32
    # TensorFlow's float32 arithmetic in its order: equal here, to within a rounding step
    # wherever a compiler fuses a multiply and an add differently.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)


@pytest.mark.parametrize("name", ["pillow-bilinear", "pillow-bicubic", "nearest"])
@pytest.mark.parametrize(("before", "after"), SIZES)
def test_the_pillow_filters_give_pillows_resize(name, before, after):
    pixels = noise(*before, seed=1)
    want = np.asarray(
        Image.fromarray(pixels).resize((after[1], after[0]), filters.PILLOW_FILTERS[name])
    )
    got = filters.resize_exact(pixels, after[1], after[0], name)
    assert got.dtype == np.uint8 and np.array_equal(got, want)


def test_every_filter_gives_its_own_pixels():
    """Each name is a different computation: no two give the same image here (the closest,
    Pillow's BILINEAR and TF's antialiased bilinear, both widen the triangle; they differ by
    Pillow's rounding to whole levels and at the edges)."""
    pixels = noise(480, 640, seed=2)
    results = {n: filters.resize_exact(pixels, 224, 224, n) for n in filters.RESIZE_FILTERS}
    names = sorted(results)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            difference = np.abs(results[first].astype(float) - results[second]).mean()
            assert difference > 0.2, (first, second, difference)


def test_an_unknown_filter_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="known: pillow-bilinear, pillow-bicubic"):
        filters.resize_exact(noise(4, 4), 2, 2, "lanczos")


def test_uint8_inputs_get_the_filtered_values_rounded():
    values = np.array([[[-0.4, 0.5, 1.5], [254.6, 255.4, 300.0]]], np.float32)
    assert filters.to_uint8(values).tolist() == [[[0, 0, 2], [255, 255, 255]]]


def exporter_pixels(data: bytes, size: tuple[int, int], name: str) -> np.ndarray:
    """What an exporter's pipeline gives: Pillow decodes, ImageOps.exif_transpose, then the
    library's resize."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    if name in filters.PILLOW_FILTERS:
        return np.asarray(image.resize(size, filters.PILLOW_FILTERS[name]))
    return tf.image.resize(np.asarray(image), size[::-1], **TF_METHODS[name]).numpy()


@pytest.mark.parametrize("name", filters.RESIZE_FILTERS)
@pytest.mark.parametrize("orientation", [1, 6, 3])
def test_a_resize_filter_gives_the_exporters_pixels_of_an_exif_rotated_jpeg(name, orientation):
    data = encoded(1200, 900, "JPEG", orientation, quality=90)
    info, got = decode_to_size(data, LIMITS, (224, 224), name)
    assert (info.width, info.height) == ((900, 1200) if orientation == 6 else (1200, 900))
    np.testing.assert_allclose(got, exporter_pixels(data, (224, 224), name), rtol=0, atol=1e-3)
    # The fast path (DCT-scaled decode at 1/4, libvips) is not these pixels.
    _, fast = decode_to_size(data, LIMITS, (224, 224))
    assert np.abs(fast.astype(np.float32) - got).mean() > 0.3


def test_max_side_with_a_resize_filter_keeps_the_aspect_ratio():
    data = encoded(1600, 1200, "PNG")
    _, got = decode_within(data, LIMITS, 400, "tf-bilinear-antialias")
    assert got.shape == (300, 400, 3) and got.dtype == np.float32
    np.testing.assert_allclose(
        got, exporter_pixels(data, (400, 300), "tf-bilinear-antialias"), rtol=0, atol=1e-3
    )
    # At or under the size, the image is decoded as it is, whatever the filter.
    _, same = decode_within(data, LIMITS, 1600, "tf-bilinear")
    assert same.shape == (1200, 1600, 3)
