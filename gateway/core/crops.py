"""A region of an image the gateway has decoded -> the serialized PredictRequest for a model:
how a pipeline's step (gateway.core.cascade) sends each crop.

A crop is prepared exactly as gateway.core.inputs prepares an image of the same pixels sent
as PNG (resized to the model's size, letterboxed, rescaled and normalised as its input plan
says), so a step answers a crop as its model answers that crop sent on its own. A model that
takes encoded images gets the crop as PNG (lossless), or as a JPEG when its plan scales the
crop down (as gateway.core.inputs does an image). The model's boxes map back to the image the
crop was cut from (`crop_box`), so what a step finds is in the caller's pixels.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np

from gateway.core.inputs import (
    InputMode,
    InputPlan,
    ModelInput,
    encoded_value,
    pixels_request,
)
from gateway.core.letterbox import letterbox
from gateway.domain import BoxTransform
from gateway.imaging import filters, resize
from gateway.imaging.decode import encode_png
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.wire import string_request


class Crop(NamedTuple):
    """A region of an image the gateway has decoded (a pipeline's step runs its model on it):
    uint8 [h, w, 3] pixels as shown (a view of the image's), at (x, y) of the image, which
    is image_width x image_height. The model's answer maps to the image's pixels."""

    pixels: np.ndarray
    x: int
    y: int
    image_width: int
    image_height: int


def crop_box(
    box: tuple[float, float, float, float], crop: Crop, inner: BoxTransform | None
) -> tuple[float, float, float, float]:
    """A normalized (ymin, xmin, ymax, xmax) box of the crop (after the crop's own `inner`
    transform, a letterbox's) as a normalized box of the image."""
    if inner is not None:
        box = inner(box)
    height, width = crop.pixels.shape[:2]
    ymin, xmin, ymax, xmax = box
    image_height, image_width = crop.image_height, crop.image_width
    return (
        (crop.y + ymin * height) / image_height,
        (crop.x + xmin * width) / image_width,
        (crop.y + ymax * height) / image_height,
        (crop.x + xmax * width) / image_width,
    )


def build_crop_input(crop: Crop, plan: InputPlan, envelope: bytes) -> ModelInput:
    """The request for decoded pixels (a pipeline's crop): sized and prepared exactly as
    build_input prepares an image of those pixels sent as PNG, so a step answers a crop as
    its model answers that crop sent on its own; a string-input model gets the crop as PNG
    (lossless), or as JPEG when the plan scales it down (as build_input does)."""
    pixels = crop.pixels
    height, width = pixels.shape[:2]
    whole = (crop.x, crop.y, width, height) == (0, 0, crop.image_width, crop.image_height)
    inner: BoxTransform | None = None
    if plan.mode is InputMode.ENCODED:
        sent = pixels
        if plan.max_side is not None and max(width, height) > plan.max_side:
            sent = resize.resize(pixels, *resize.fit_within(width, height, plan.max_side))
            encoded = resize.encode_jpeg(sent)
        else:
            encoded = encode_png(np.ascontiguousarray(pixels))
        value = encoded_value(encoded, plan)
        request = string_request(envelope, plan.key, value)
        mapped: BoxTransform | None = None if whole else partial(crop_box, crop=crop, inner=None)
        return ModelInput(
            request, crop.image_width, crop.image_height, mapped,
            (sent.shape[1], sent.shape[0]), tfs.DT_STRING, (1,), len(value),
        )  # fmt: skip
    if plan.pad_to is not None:
        pixels, inner = letterbox(pixels, plan.pad_to, plan.pad_value)
    elif plan.size is not None:
        pixels = _sized(pixels, plan.size, plan.resize_filter)
    elif plan.max_side is not None:
        pixels = _sized(pixels, resize.fit_within(width, height, plan.max_side), plan.resize_filter)
    transform = inner if whole else partial(crop_box, crop=crop, inner=inner)
    return pixels_request(pixels, plan, envelope, crop.image_width, crop.image_height, transform)


def _sized(pixels: np.ndarray, size: tuple[int, int], resize_filter: str | None) -> np.ndarray:
    """Pixels at `size` (width, height) as gateway.imaging.resize sizes a decoded image."""
    if size == (pixels.shape[1], pixels.shape[0]):
        return pixels
    if resize_filter is not None:
        return filters.resize_exact(pixels, *size, resize_filter)
    return resize.resize(np.ascontiguousarray(pixels), *size)
