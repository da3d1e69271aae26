"""Masks in pixels of the image as a viewer shows it: a model's mask grid (box-relative
`[m, m]` probabilities, or YOLO prototypes combined into logits over the whole image sent)
sampled at the centres of the displayed image's pixels, thresholded.

Frame.transform maps a normalized box of the image the model saw to the displayed image; the
gateway's transforms (EXIF orientation: gateway.imaging.orientation.orient_box; letterboxing:
gateway.core.letterbox.unletterbox) are axis-aligned affine maps, so each displayed axis is
one axis of the image sent, scaled and shifted (`raster_axes` reads that map off the
transform). A displayed pixel's centre maps back to a point of the image sent, then to grid
coordinates, where the grid is sampled bilinearly with half-pixel centres:
- box-relative masks (TF Model Garden / OD API Mask R-CNN) as Model Garden pastes them
  (official/vision/ops/mask_ops.py paste_instance_masks, Detectron's paste, which the COCO
  evaluation uses): the m x m grid padded with a zero cell on each side, the box (in the
  displayed image's pixels) grown about its centre by (m + 2) / m and truncated to whole
  pixels, the padded grid resized bilinearly (cv2.resize, half-pixel centres) onto that
  rectangle's w = x2 - x1 + 1 by h = y2 - y1 + 1 pixels (`box_mask`). The OD API's
  utils/ops.py reframe_box_masks_to_image_masks samples the same grid with crop_and_resize,
  within a pixel of it;
- YOLO prototypes: logits over the image sent, edges repeated, the mask kept inside the box
  only (ultralytics/utils/ops.py process_mask_native: scale_masks' bilinear upsampling with
  align_corners=False, crop_mask's x1 <= r < x2 on pixel indices, logits > 0 for 0.5): the
  default `mask_resolution = "native"` (for "input": gateway.tasks.segmentation.inputmasks).

Memory: one instance at a time, only the rows and columns its box covers; the float samples
go in strips of at most _STRIP values; what stays is a bool per pixel of the box.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gateway.domain import BoxTransform

_STRIP = 1 << 20  # float samples computed at once (4 MB)
_EPS = 1e-9


class Axis(NamedTuple):
    """A displayed axis (rows or columns) as a map of one axis of the image sent: displayed
    normalized coordinate = offset + scale * sent normalized coordinate of axis `source`
    (0: y, 1: x)."""

    source: int
    offset: float
    scale: float


Region = tuple[float, float, float, float]  # (ymin, xmin, ymax, xmax), normalized


class Shape(NamedTuple):
    """A mask to paste: its grid [gh, gw], the region of the image sent it spans, the region
    it is kept in, and whether its edges repeat (else a zero border one cell wide)."""

    grid: np.ndarray
    spans: Region
    keep: Region
    edge: bool
    logits: bool = False  # the grid holds logits: compared with the threshold's logit


class Placed(NamedTuple):
    """A mask's pixels within the displayed image: `bits` [h, w] at column x0, row y0."""

    x0: int
    y0: int
    bits: np.ndarray


def raster_axes(transform: BoxTransform | None) -> tuple[Axis, Axis]:
    """The displayed rows' and columns' maps from the image sent. ValueError for a transform
    that is not an axis-aligned affine map (none of the gateway's)."""
    if transform is None:
        return Axis(0, 0.0, 1.0), Axis(1, 0.0, 1.0)

    def at(y: float, x: float) -> tuple[float, float]:
        ymin, xmin, _, _ = transform((y, x, y, x))
        return ymin, xmin

    v0, u0 = at(0.0, 0.0)
    vy, uy = at(1.0, 0.0)
    vx, ux = at(0.0, 1.0)
    dv_dy, du_dy, dv_dx, du_dx = vy - v0, uy - u0, vx - v0, ux - u0
    if abs(dv_dx) < _EPS and abs(du_dy) < _EPS and abs(dv_dy) > _EPS and abs(du_dx) > _EPS:
        rows, cols = Axis(0, v0, dv_dy), Axis(1, u0, du_dx)
    elif abs(dv_dy) < _EPS and abs(du_dx) < _EPS and abs(dv_dx) > _EPS and abs(du_dy) > _EPS:
        rows, cols = Axis(1, v0, dv_dx), Axis(0, u0, du_dy)
    else:
        raise ValueError("the image transform is not an axis-aligned affine map")
    v1, u1 = at(1.0, 1.0)
    if abs(v1 - (v0 + dv_dy + dv_dx)) > 1e-6 or abs(u1 - (u0 + du_dy + du_dx)) > 1e-6:
        raise ValueError("the image transform is not an affine map")
    return rows, cols


class _Taps(NamedTuple):
    """Bilinear sampling along one displayed axis: from pixel `first` on, each pixel's two
    grid cells and their weights (a cell off the grid weighs 0), and whether the pixel lies
    in the kept region."""

    first: int
    low: np.ndarray
    high: np.ndarray
    low_weight: np.ndarray
    high_weight: np.ndarray
    inside: np.ndarray


def _extent(axis: Axis, length: int, keep: tuple[float, float]) -> tuple[int, int]:
    """The displayed pixels [first, last) of `axis` (of `length` pixels) the sent interval
    `keep` covers."""
    ends = sorted((axis.offset + axis.scale * keep[0], axis.offset + axis.scale * keep[1]))
    return max(0, math.floor(ends[0] * length)), min(length, math.ceil(ends[1] * length))


def footprint(shape: Shape, axes: tuple[Axis, Axis], width: int, height: int) -> int:
    """How many pixels pasting `shape` computes (the box's rows x columns in the displayed
    image): its price, known before the paste."""
    keep = shape.keep
    sizes = []
    for axis, length in zip(axes, (height, width), strict=True):
        first, last = _extent(axis, length, (keep[axis.source], keep[axis.source + 2]))
        sizes.append(max(0, last - first))
    return sizes[0] * sizes[1]


def _taps(
    axis: Axis,
    length: int,
    grid: tuple[float, float, int],
    keep: tuple[float, float],
    edge: bool,
) -> _Taps:
    """The taps of the displayed pixels of `axis` (of `length` pixels) the mask can cover,
    for a grid of n cells spanning the sent interval lo..hi (`grid`); `keep`: the sent
    interval the mask is kept in."""
    lo, hi, n = grid
    keep_lo, keep_hi = keep
    ends = sorted((axis.offset + axis.scale * keep_lo, axis.offset + axis.scale * keep_hi))
    first, last = _extent(axis, length, keep)
    if last <= first or hi - lo <= 0 or n < 1:
        empty = np.zeros(0, np.int64)
        return _Taps(first, empty, empty, empty.astype(np.float32), empty.astype(np.float32),
                     empty.astype(bool))  # fmt: skip
    centres = (np.arange(first, last, dtype=np.float64) + 0.5) / length
    sent = (centres - axis.offset) / axis.scale
    g = (sent - lo) / (hi - lo) * n - 0.5
    if edge:
        g = np.clip(g, 0.0, n - 1)
    low = np.floor(g)
    high_weight = g - low
    low_weight = 1.0 - high_weight
    low_index = low.astype(np.int64)
    high_index = low_index + 1
    # Cells off the grid are the zero border (or, with edges repeated, never reached but at
    # weight 0 on the last cell).
    low_weight[(low_index < 0) | (low_index >= n)] = 0.0
    high_weight[(high_index < 0) | (high_index >= n)] = 0.0
    # Kept: the pixels whose index lies in the kept interval in displayed pixels, as
    # Ultralytics' crop_mask keeps x1 <= r < x2.
    index = np.arange(first, last, dtype=np.float64)
    return _Taps(
        first,
        np.clip(low_index, 0, n - 1),
        np.clip(high_index, 0, n - 1),
        low_weight.astype(np.float32),
        high_weight.astype(np.float32),
        (index >= ends[0] * length) & (index < ends[1] * length),
    )


def box_mask(
    grid: np.ndarray, box: list[float], axes: tuple[Axis, Axis], width: int, height: int
) -> Shape:
    """The paste of a box-relative grid [m, m] (see the module's docstring) for a box
    (ymin, xmin, ymax, xmax) normalized to the image sent, as a Shape over the image sent."""
    padded = np.pad(grid.astype(np.float32), 1)
    m_h, m_w = grid.shape
    scale = max((m_w + 2.0) / m_w, (m_h + 2.0) / m_h)
    spans = [0.0, 0.0, 0.0, 0.0]
    for axis, length in zip(axes, (height, width), strict=True):
        s = axis.source
        a, b = sorted((axis.offset + axis.scale * box[s], axis.offset + axis.scale * box[s + 2]))
        centre, half = (a + b) / 2 * length, (b - a) / 2 * length * scale
        start = int(centre - half)  # np.int32 truncation, as paste_instance_masks
        end = int(centre + half) + 1
        ends = sorted(((start / length - axis.offset) / axis.scale,
                       (end / length - axis.offset) / axis.scale))  # fmt: skip
        spans[s], spans[s + 2] = ends
    region = (spans[0], spans[1], spans[2], spans[3])
    return Shape(padded, region, region, True)


def paste(
    shape: Shape,
    axes: tuple[Axis, Axis],
    width: int,
    height: int,
    threshold: float,
    check: Callable[[], None] | None = None,
) -> Placed:
    """The pixels of a width x height displayed image where the shape's grid (sampled as the
    module says) is above `threshold`. Separable: the grid's rows are interpolated to the
    displayed rows, then its columns to the displayed columns (elementwise, two taps each).
    `check` is called before each strip (a few milliseconds apart): the request's deadline
    (gateway.domain.Work.check), which stops the paste by raising."""
    grid, spans, keep, edge, logits = shape
    if logits:
        threshold = math.log(threshold / (1.0 - threshold))
    rows_axis, cols_axis = axes
    taps: list[_Taps] = []
    for axis, length in ((rows_axis, height), (cols_axis, width)):
        s = axis.source
        cells = (spans[s], spans[s + 2], grid.shape[s])
        taps.append(_taps(axis, length, cells, (keep[s], keep[s + 2]), edge))
    rows, cols = taps
    bits = np.zeros((len(rows.low), len(cols.low)), bool)
    if bits.size == 0:
        return Placed(cols.first, rows.first, bits)
    oriented = grid.astype(np.float32) if rows_axis.source == 0 else grid.T.astype(np.float32)
    by_row = (oriented[rows.low] * rows.low_weight[:, None]
              + oriented[rows.high] * rows.high_weight[:, None])  # fmt: skip
    strip = max(1, _STRIP // max(1, bits.shape[1]))
    for start in range(0, bits.shape[0], strip):
        if check is not None:
            check()
        part = by_row[start : start + strip]
        values = part[:, cols.low] * cols.low_weight + part[:, cols.high] * cols.high_weight
        inside = rows.inside[start : start + strip, None] & cols.inside[None, :]
        bits[start : start + strip] = (values > threshold) & inside
    return Placed(cols.first, rows.first, bits)
