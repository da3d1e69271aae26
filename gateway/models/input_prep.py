"""`[models.NAME.input]`: how the gateway prepares an image for a model where its graph does
not (InputPrep), read from the model config file; combinations that cannot work are refused
naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.imaging.filters import RESIZE_FILTERS
from gateway.models.values import (
    ModelConfigError,
    is_whole,
    read_choice,
    read_integer,
    read_number,
    read_size,
    read_triple,
    refuse_unknown,
)

DEFAULT_TF_EXAMPLE_KEY = "image/encoded"  # what OD API and Model Garden tf_example exports read


@dataclass(frozen=True)
class InputPrep:
    """How the gateway prepares an image for the model, where the graph does not do it."""

    resize: tuple[int, int] | None = None  # (height, width) for signatures without a size
    max_side: int | None = None
    scale: float | None = None  # None: pixel values as they are (0..255)
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    layout: str | None = None  # NHWC | NCHW; None: from the signature
    dtype: str | None = None  # uint8 | float32; None: from the signature
    string_encoding: str = "raw"  # raw | base64url | tf_example
    channel_order: str = "RGB"  # RGB | BGR: the order the model takes its channels in
    name: str | None = None  # the signature input to fill; None: its only input
    tf_example_key: str = DEFAULT_TF_EXAMPLE_KEY  # the Example feature holding the image
    # The exporter's resizing (gateway.imaging.filters), computed exactly on the fully
    # decoded image; None: the fast path (DCT-scaled decode, libvips).
    resize_filter: str | None = None
    # (height, width) of the canvas every image is letterboxed into (scaled to fit, padded
    # bottom and right with pad_value), so variable-size pixel inputs can be batched.
    pad_to: tuple[int, int] | None = None
    pad_value: int = 0


_INPUT_KEYS = {
    "resize",
    "max_side",
    "scale",
    "mean",
    "std",
    "layout",
    "dtype",
    "string_encoding",
    "channel_order",
    "name",
    "tf_example_key",
    "resize_filter",
    "pad_to",
    "pad_value",
}

# Largest side of a pad_to canvas: 8K, far beyond what a detector takes.
MAX_PAD_SIDE = 8192


def _read_pad(
    table: Mapping[str, Any], path: Path, where: str
) -> tuple[tuple[int, int] | None, int]:
    pad_to = read_size(table, "pad_to", path, where, MAX_PAD_SIDE)
    pad_value = table.get("pad_value", 0)
    if not is_whole(pad_value) or not 0 <= pad_value <= 255:
        raise ModelConfigError(
            f"{path}: {where}.pad_value must be a pixel value from 0 to 255, got {pad_value!r}"
        )
    if "pad_value" in table and pad_to is None:
        raise ModelConfigError(f"{path}: {where}.pad_value needs pad_to = [height, width]")
    if pad_to is not None and ("resize" in table or "max_side" in table):
        raise ModelConfigError(
            f"{path}: {where} has pad_to with resize or max_side; pad_to already sets the size "
            "images are scaled to (keeping their aspect ratio)"
        )
    if pad_to is not None and "resize_filter" in table:
        raise ModelConfigError(
            f"{path}: {where} has pad_to with resize_filter; letterboxing resizes with the "
            "gateway's own filter only"
        )
    return pad_to, pad_value


def read_input(table: Mapping[str, Any], path: Path, where: str) -> InputPrep:
    """The `[input]` table at `where` (e.g. models.NAME.input) of the file at `path`."""
    refuse_unknown(table, _INPUT_KEYS, str(path), where + ".")
    resize = read_size(table, "resize", path, where)
    max_side = read_integer(table, "max_side", path, where)
    if resize is not None and max_side is not None:
        raise ModelConfigError(
            f"{path}: {where} has both resize and max_side; a fixed size already bounds the side"
        )
    scale = read_number(table, "scale", path, where, 0.0, None)
    mean = read_triple(table, "mean", path, where)
    std = read_triple(table, "std", path, where)
    if std is not None and any(v == 0 for v in std):
        raise ModelConfigError(f"{path}: {where}.std must not contain 0")
    layout = read_choice(table, "layout", ("NHWC", "NCHW"), path, where)
    dtype = read_choice(table, "dtype", ("uint8", "float32"), path, where)
    encoding = (
        read_choice(table, "string_encoding", ("raw", "base64url", "tf_example"), path, where)
        or "raw"
    )
    channel_order = read_choice(table, "channel_order", ("RGB", "BGR"), path, where) or "RGB"
    resize_filter = read_choice(table, "resize_filter", RESIZE_FILTERS, path, where)
    name = None
    if "name" in table:
        name = table["name"]
        if not isinstance(name, str) or not name:
            raise ModelConfigError(f"{path}: {where}.name must name an input of the signature")
    example_key = DEFAULT_TF_EXAMPLE_KEY
    if "tf_example_key" in table:
        example_key = table["tf_example_key"]
        if encoding != "tf_example":
            raise ModelConfigError(
                f"{path}: {where}.tf_example_key is for string_encoding = 'tf_example'"
            )
        if not isinstance(example_key, str) or not example_key:
            raise ModelConfigError(f"{path}: {where}.tf_example_key must be a feature name")
    pad_to, pad_value = _read_pad(table, path, where)
    normalises = scale is not None or mean is not None or std is not None
    if dtype == "uint8" and normalises:
        raise ModelConfigError(
            f"{path}: {where}: scale, mean and std need dtype = 'float32' (uint8 inputs take "
            "the pixels as they are)"
        )
    pixel_keys = normalises or layout is not None or dtype is not None or channel_order != "RGB"
    if encoding != "raw" and (pixel_keys or resize_filter is not None or pad_to is not None):
        raise ModelConfigError(
            f"{path}: {where}.string_encoding is for models that take encoded images; "
            "scale, mean, std, layout, dtype, channel_order and resize_filter are for models "
            "that take pixels, and so is pad_to"
        )
    return InputPrep(
        resize,
        max_side,
        scale,
        mean,
        std,
        layout,
        dtype,
        encoding,
        channel_order,
        name,
        example_key,
        resize_filter,
        pad_to,
        pad_value,
    )
