"""Boxes in the forms exporters give them -> normalized [ymin, xmin, ymax, xmax].

Formats: `yxyx` (OD API, Model Garden), `xyxy`, `xywh` (top-left corner, width, height),
`cxcywh` (centre, width, height: YOLO). Coordinates: `normalized` (fractions of the image the
model received), `pixels` (pixels of the image the gateway sent), `image_info` (Model
Garden: pixels of the model's own rescaled input, undone with its `image_info` output).
"""

from __future__ import annotations

import numpy as np

BOX_FORMATS = ("yxyx", "xyxy", "xywh", "cxcywh")
COORDINATES = ("normalized", "pixels", "image_info")


class BoxError(ValueError):
    """Box values that cannot be read in the declared form."""


def to_yxyx(boxes: np.ndarray, box_format: str) -> np.ndarray:
    """[N, 4] boxes in `box_format` -> [N, 4] float64 [ymin, xmin, ymax, xmax], same units."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if box_format == "yxyx":
        return b.copy()
    if box_format == "xyxy":
        return b[:, [1, 0, 3, 2]]
    if box_format == "xywh":
        x, y, w, h = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        return np.stack([y, x, y + h, x + w], axis=1)
    if box_format == "cxcywh":
        cx, cy, w, h = b[:, 0], b[:, 1], b[:, 2] / 2, b[:, 3] / 2
        return np.stack([cy - h, cx - w, cy + h, cx + w], axis=1)
    raise ValueError(f"unknown box format {box_format!r}")


def normalize(
    yxyx: np.ndarray,
    coordinates: str,
    sent_size: tuple[int, int] | None = None,
    image_info: np.ndarray | None = None,
) -> np.ndarray:
    """[N, 4] yxyx boxes in `coordinates` -> fractions of the image the model received.

    `sent_size` (width, height) is needed for `pixels`, `image_info` (Model Garden's [4, 2]
    rows: original size, scaled size, scale, offset) for `image_info`. Raises BoxError when
    that information is unusable.
    """
    if coordinates == "normalized":
        return yxyx
    if coordinates == "pixels":
        if sent_size is None or sent_size[0] <= 0 or sent_size[1] <= 0:
            raise BoxError("the size of the image sent is unknown")
        width, height = sent_size
        return yxyx / np.array([height, width, height, width], dtype=np.float64)
    if coordinates == "image_info":
        if image_info is None:
            raise BoxError("image_info is missing")
        info = np.asarray(image_info, dtype=np.float64).reshape(-1)
        if info.size < 8 or not np.isfinite(info[:8]).all():
            raise BoxError(f"image_info has {info.size} values; expected [4, 2]")
        height, width, y_scale, x_scale, y_offset, x_offset = (
            info[0], info[1], info[4], info[5], info[6], info[7]
        )  # fmt: skip
        if height <= 0 or width <= 0 or y_scale <= 0 or x_scale <= 0:
            raise BoxError(
                f"image_info gives an original size of {width:g}x{height:g} and a scale of "
                f"{x_scale:g}x{y_scale:g}; expected positive numbers"
            )
        # Model Garden scales the image by `scale`, then crops at `offset` (0 when serving).
        offset = np.array([y_offset, x_offset, y_offset, x_offset])
        scale = np.array([y_scale, x_scale, y_scale, x_scale])
        return (yxyx + offset) / scale / np.array([height, width, height, width])
    raise ValueError(f"unknown coordinates {coordinates!r}")
