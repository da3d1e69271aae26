"""Exact resizing (`[models.NAME.input] resize_filter`): the filter an exporter resized its
training images with, computed as its library computes it, on the fully decoded image.

- `pillow-bilinear`, `pillow-bicubic`, `nearest`: Pillow's Image.resize with BILINEAR,
  BICUBIC or NEAREST (what Hugging Face image processors and keras.utils.load_img call;
  load_img's default is nearest), uint8 out as Pillow gives it;
- `tf-bilinear`: tf.image.resize(method="bilinear") (keras.layers.Resizing, Keras'
  image_dataset_from_directory, Model Garden's preprocessing): half-pixel centres, two taps
  per axis, edges clamped;
- `tf-bilinear-antialias`: tf.image.resize(method="bilinear", antialias=True), which is TF's
  ScaleAndTranslate with the triangle kernel, widened by the scale factor when shrinking and
  normalised over the taps that fall inside the image.

The TF filters are TensorFlow's float32 arithmetic in numpy, in TensorFlow's order (rows,
then columns), so the gateway needs no TensorFlow: float32 out, as tf.image.resize gives.
tests/imaging/test_filters.py compares every filter with the library it names.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

PILLOW_FILTERS = {
    "pillow-bilinear": Image.Resampling.BILINEAR,
    "pillow-bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}
RESIZE_FILTERS = (
    "pillow-bilinear",
    "pillow-bicubic",
    "tf-bilinear",
    "tf-bilinear-antialias",
    "nearest",
)

# What check-models and the startup log say each filter is.
DESCRIPTIONS = {
    "pillow-bilinear": "Pillow's BILINEAR",
    "pillow-bicubic": "Pillow's BICUBIC",
    "tf-bilinear": "tf.image.resize bilinear",
    "tf-bilinear-antialias": "tf.image.resize bilinear, antialias=True",
    "nearest": "Pillow's NEAREST",
}

_HALF = np.float32(0.5)
_ONE = np.float32(1.0)


def resize_exact(pixels: np.ndarray, width: int, height: int, name: str) -> np.ndarray:
    """uint8 [h, w, 3] pixels resized to [height, width, 3] by the filter `name`: uint8 for
    Pillow's filters, float32 for TensorFlow's (each as its library returns them)."""
    if name in PILLOW_FILTERS:
        image = Image.fromarray(np.ascontiguousarray(pixels))
        return np.asarray(image.resize((width, height), PILLOW_FILTERS[name]))
    if name == "tf-bilinear":
        return _tf_bilinear(pixels, width, height)
    if name == "tf-bilinear-antialias":
        return _tf_antialias(pixels, width, height)
    raise ValueError(f"unknown resize filter {name!r}; known: {', '.join(RESIZE_FILTERS)}")


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """Filtered pixels for a uint8 input: float values rounded to the nearest level."""
    if pixels.dtype == np.uint8:
        return pixels
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


# --- tf.image.resize(method="bilinear"): ResizeBilinear with half_pixel_centers=True ------


def _bilinear_axis(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TF's compute_interpolation_weights: lower and upper source index and the lerp."""
    scale = np.float32(in_size) / np.float32(out_size)
    source = (np.arange(out_size, dtype=np.float32) + _HALF) * scale - _HALF
    floor = np.floor(source)
    lower = np.maximum(floor, 0).astype(np.intp)
    upper = np.minimum(np.ceil(source), in_size - 1).astype(np.intp)
    return lower, upper, (source - floor).astype(np.float32)


def _tf_bilinear(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    y_lower, y_upper, y_lerp = _bilinear_axis(pixels.shape[0], height)
    x_lower, x_upper, x_lerp = _bilinear_axis(pixels.shape[1], width)
    top_rows = pixels[y_lower].astype(np.float32)
    bottom_rows = pixels[y_upper].astype(np.float32)
    x_lerp = x_lerp[None, :, None]
    # compute_lerp: top = tl + (tr - tl) * x_lerp; ...; top + (bottom - top) * y_lerp
    top = top_rows[:, x_lower]
    top += (top_rows[:, x_upper] - top) * x_lerp
    bottom = bottom_rows[:, x_lower]
    bottom += (bottom_rows[:, x_upper] - bottom) * x_lerp
    top += (bottom - top) * y_lerp[:, None, None]
    return top


# --- tf.image.resize(method="bilinear", antialias=True): ScaleAndTranslate, "triangle" ------


def _spans(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """TF's ComputeSpans for the triangle kernel (radius 1), translation 0: for each output
    sample, the source index of each tap [out, span] and its normalised weight."""
    scale = np.float32(out_size) / np.float32(in_size)
    inv_scale = np.float32(1.0 / float(scale))
    kernel_scale = max(inv_scale, _ONE)  # antialias: the kernel widens when shrinking
    span_size = min(2 * math.ceil(float(kernel_scale)) + 1, in_size)
    sample = (np.arange(out_size, dtype=np.float32) + _HALF) * inv_scale
    start = np.ceil(sample - kernel_scale - _HALF).astype(np.int64)
    end = np.floor(sample + kernel_scale - _HALF).astype(np.int64)
    start = np.clip(start, 0, in_size - 1)
    end = np.clip(end, 0, in_size - 1) + 1
    sources = start[:, None] + np.arange(span_size)
    one_over_kernel_scale = _ONE / kernel_scale
    position = (sources.astype(np.float32) + _HALF - sample[:, None]) * one_over_kernel_scale
    weights = np.maximum(_ONE - np.abs(position), np.float32(0))
    weights[sources >= end[:, None]] = 0
    total = np.zeros(out_size, np.float32)
    for tap in range(span_size):  # summed in order, as TF does
        total += weights[:, tap]
    usable = np.abs(total) >= 1000 * np.finfo(np.float32).tiny
    weights *= np.where(usable, _ONE / np.where(usable, total, _ONE), 0)[:, None]
    return np.minimum(sources, in_size - 1), weights.astype(np.float32)


def _tf_antialias(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    row_sources, row_weights = _spans(pixels.shape[0], height)
    column_sources, column_weights = _spans(pixels.shape[1], width)
    rows = np.zeros((height, pixels.shape[1], 3), np.float32)  # rows first, as TF does
    for tap in range(row_sources.shape[1]):
        rows += row_weights[:, tap, None, None] * pixels[row_sources[:, tap]].astype(np.float32)
    out = np.zeros((height, width, 3), np.float32)
    for tap in range(column_sources.shape[1]):
        out += column_weights[None, :, tap, None] * rows[:, column_sources[:, tap]]
    return out
