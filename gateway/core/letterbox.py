"""Letterboxing (`input.pad_to`): a variable-size image on a fixed canvas, so images of any
size can share one batch, and its boxes mapped back exactly.

The image, as a viewer shows it (EXIF orientation applied), is scaled to fit the canvas
keeping its aspect ratio (enlarged or reduced, as a detector's own resizer would), placed at
the top left, and the bottom and right are filled with `pad_value`. A box the model finds is
normalized to the canvas; the image fills the top-left content x content_height of it, so a
canvas fraction y maps to y * canvas_height / content_height of the image (and likewise for
x): exact, whatever rounding gave the content size, because the resize maps the content's
edges to the image's edges.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from gateway import errors
from gateway.domain import BoxTransform
from gateway.imaging import resize
from gateway.imaging.header import ImageInfo, ImageLimits, inspect_image


def content_size(width: int, height: int, canvas: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of a width x height image scaled to fit `canvas` (width, height)."""
    canvas_width, canvas_height = canvas
    scale = min(canvas_width / width, canvas_height / height)
    return (
        min(canvas_width, max(1, round(width * scale))),
        min(canvas_height, max(1, round(height * scale))),
    )


def unletterbox(
    box: tuple[float, float, float, float], y_scale: float, x_scale: float
) -> tuple[float, float, float, float]:
    """A normalized (ymin, xmin, ymax, xmax) box of the canvas as a box of the image."""
    ymin, xmin, ymax, xmax = box
    return ymin * y_scale, xmin * x_scale, ymax * y_scale, xmax * x_scale


def decode_letterboxed(
    data: bytes, limits: ImageLimits, canvas: tuple[int, int], pad_value: int
) -> tuple[ImageInfo, np.ndarray, BoxTransform]:
    """The image letterboxed on a `canvas` (width, height) of uint8 [height, width, 3], its
    info, and the transform of the model's boxes back to the image."""
    info = inspect_image(data, limits)
    width, height = content_size(info.width, info.height, canvas)
    info, pixels = resize.decode_to_size(data, limits, (width, height))
    out, transform = _on_canvas(pixels, canvas, pad_value)
    return info, out, transform


def letterbox(
    pixels: np.ndarray, canvas: tuple[int, int], pad_value: int
) -> tuple[np.ndarray, BoxTransform]:
    """Decoded uint8 [h, w, 3] pixels letterboxed on `canvas` as decode_letterboxed does an
    image of them, and the transform of the model's boxes back to them."""
    width, height = content_size(pixels.shape[1], pixels.shape[0], canvas)
    return _on_canvas(resize.resize(np.ascontiguousarray(pixels), width, height), canvas, pad_value)


def _on_canvas(
    pixels: np.ndarray, canvas: tuple[int, int], pad_value: int
) -> tuple[np.ndarray, BoxTransform]:
    height, width = pixels.shape[:2]
    canvas_width, canvas_height = canvas
    out = np.empty((canvas_height, canvas_width, 3), np.uint8)
    out[:height, :width] = pixels
    out[height:] = pad_value
    out[:height, width:] = pad_value
    transform = partial(unletterbox, y_scale=canvas_height / height, x_scale=canvas_width / width)
    return out, transform


def check_pad_to(shape: tuple[int, ...], layout: str, key: str, what: str) -> None:
    """BAD_MODEL unless input `key` of `shape` is variable-size pixels with a free batch
    dimension: what `pad_to` is for."""
    height, width = (shape[1], shape[2]) if layout == "NHWC" else (shape[2], shape[3])
    shown = str(list(shape)).replace(" ", "")
    if height > 0 or width > 0:
        raise errors.bad_model(
            f"the model config sets input.pad_to but {what} fixes the size of its input "
            f"'{key}' {shown}; remove pad_to (the gateway resizes to the signature's size)"
        )
    if shape[0] != -1:
        raise errors.bad_model(
            f"the model config sets input.pad_to but {what} fixes the batch of its input "
            f"'{key}' {shown} at {shape[0]}, so its requests are never batched; remove pad_to "
            "(it only serves batching, and costs the padding)"
        )
