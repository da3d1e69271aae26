"""YOLO-seg masks with `mask_resolution = "input"`, as Ultralytics' predictor makes them by
default (`retina_masks=False`; ultralytics/utils/ops.py):

1. `process_mask(..., upsample=True)`: the mask logits (coefficients . prototypes) upsampled
   to the pixels of the image sent (`F.interpolate`, bilinear, align_corners=False), above
   the threshold's logit (`gt_(0.0)` for 0.5), kept in the box in the sent image's pixels
   (`crop_mask`: pixel indices x1 <= c < x2);
2. shown on the image (`scale_masks` of that 0/1 mask, as plotting's Annotator.masks): cut to
   the sent pixels the displayed image fills (all of them, or a letterbox's top left),
   resized bilinearly to the displayed image, a pixel in where the sample is above 0.5.

Resizing a 0/1 mask puts many samples exactly half way between a 0 and a 1 (whenever a
displayed pixel's centre falls midway between two sent pixels' centres); PyTorch's CPU
kernel decides those by its float32 arithmetic, so the taps here are computed as it computes
them: the scale in/out in float32, the source coordinate (d + 0.5) * scale - 0.5 rounded once
to float32 (its fused multiply-add), clamped at 0, the weights in float32
(aten/src/ATen/native/UpSample.h area_pixel_compute_source_index, guard_index_and_lambda).

Memory: one instance at a time: its box's pixels of the image sent (a bool each), their
columns resampled to the displayed width (a float each), and the displayed rows the box
covers, in strips of at most _STRIP floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gateway.tasks.segmentation.raster import Axis, Placed, Region

_STRIP = 1 << 20
_EMPTY = Placed(0, 0, np.zeros((0, 0), bool))


class Taps(NamedTuple):
    """Bilinear resizing of n_in cells to n_out: each output cell's two input cells and
    their float32 weights."""

    low: np.ndarray
    high: np.ndarray
    low_weight: np.ndarray
    high_weight: np.ndarray


def linear_taps(n_in: int, n_out: int) -> Taps:
    """PyTorch's bilinear (align_corners=False) taps, in its float32 arithmetic (see the
    module's docstring); equal sizes copy, as its kernel does."""
    if n_in == n_out:
        same = np.arange(n_out, dtype=np.int64)
        return Taps(same, same, np.ones(n_out, np.float32), np.zeros(n_out, np.float32))
    scale = np.float32(n_in) / np.float32(n_out)
    centres = np.arange(n_out, dtype=np.float64) + 0.5
    # float64 holds the product and the difference exactly: one rounding, as an FMA.
    source = np.maximum((np.float64(scale) * centres - 0.5).astype(np.float32), np.float32(0))
    low = np.minimum(np.floor(source).astype(np.int64), n_in - 1)
    high_weight = np.clip(source - low.astype(np.float32), 0, 1).astype(np.float32)
    return Taps(low, np.minimum(low + 1, n_in - 1), np.float32(1) - high_weight, high_weight)


class _Side(NamedTuple):
    """One displayed axis: its length, the sent axis it shows (0: rows, 1: columns), the
    sent pixels [start, end) it shows, and whether it runs against them."""

    length: int
    source: int
    start: int
    end: int
    flipped: bool


def _sides(axes: tuple[Axis, Axis], sent: tuple[int, int], shown: tuple[int, int]) -> list[_Side]:
    sizes = (sent[1], sent[0])
    sides = []
    for axis, length in zip(axes, (shown[1], shown[0]), strict=True):
        size = sizes[axis.source]
        lo, hi = sorted((-axis.offset / axis.scale, (1.0 - axis.offset) / axis.scale))
        start, end = max(0, round(lo * size)), min(size, round(hi * size))
        sides.append(_Side(length, axis.source, start, end, axis.scale < 0))
    return sides


def at_input(
    logits: np.ndarray,
    box: Region,
    sent: tuple[int, int],
    axes: tuple[Axis, Axis],
    shown: tuple[int, int],
    threshold: float,
    check: Callable[[], None] | None = None,
) -> Placed:
    """The mask (see the module's docstring) of YOLO logits [h, w] over the image sent
    (`sent`: width, height) for a box (ymin, xmin, ymax, xmax) normalized to it, on the
    displayed image (`shown`: width, height; `axes`: raster.raster_axes of the frame).
    `check` is called between steps and strips (the request's deadline: Work.check)."""
    sides = _sides(axes, sent, shown)
    if any(side.end <= side.start for side in sides):
        return _EMPTY
    # Step 1 over the sent pixels in the box and the shown part: [lo, hi) per sent axis.
    sizes = (sent[1], sent[0])
    window = []
    for s in (0, 1):
        side = sides[0] if sides[0].source == s else sides[1]
        lo = max(side.start, math.ceil(box[s] * sizes[s]))
        hi = min(side.end, math.ceil(box[s + 2] * sizes[s]))
        window.append((lo, hi))
    (r0, r1), (c0, c1) = window
    if r1 <= r0 or c1 <= c0:
        return _EMPTY
    rows, cols = linear_taps(logits.shape[0], sizes[0]), linear_taps(logits.shape[1], sizes[1])
    grid = logits.astype(np.float32)
    part = slice(r0, r1)
    by_row = (grid[rows.low[part]] * rows.low_weight[part, None]
              + grid[rows.high[part]] * rows.high_weight[part, None])  # fmt: skip
    part = slice(c0, c1)
    values = by_row[:, cols.low[part]] * cols.low_weight[part] + (
        by_row[:, cols.high[part]] * cols.high_weight[part]
    )
    bits = values > np.float32(math.log(threshold / (1.0 - threshold)))
    if check is not None:
        check()
    if not bits.any():
        return _EMPTY
    # Step 2: per displayed axis, the taps into the shown part, as sent pixel indices.
    taps = []
    for side in sides:
        t = linear_taps(side.end - side.start, side.length)
        if side.flipped:
            low, high = side.end - 1 - t.low, side.end - 1 - t.high
        else:
            low, high = side.start + t.low, side.start + t.high
        lo, hi = window[side.source]
        touches = ((low >= lo) & (low < hi)) | ((high >= lo) & (high < hi))
        found = np.flatnonzero(touches)
        if not len(found):
            return _EMPTY
        first, last = int(found[0]), int(found[-1]) + 1  # the taps are monotonic
        low, high = low[first:last], high[first:last]
        # Off the window the mask is 0: such a tap weighs nothing.
        low_weight = np.where((low >= lo) & (low < hi), t.low_weight[first:last], 0)
        high_weight = np.where((high >= lo) & (high < hi), t.high_weight[first:last], 0)
        taps.append((first, np.clip(low - lo, 0, hi - lo - 1), np.clip(high - lo, 0, hi - lo - 1),
                     low_weight.astype(np.float32), high_weight.astype(np.float32)))  # fmt: skip
    (y0, ry_low, ry_high, wy_low, wy_high), (x0, cx_low, cx_high, wx_low, wx_high) = taps
    mask = bits.astype(np.float32) if sides[0].source == 0 else bits.T.astype(np.float32)
    # Columns first, then rows (PyTorch's order; on a 0/1 mask each product is exact).
    across = mask[:, cx_low] * wx_low + mask[:, cx_high] * wx_high
    out = np.zeros((len(ry_low), len(cx_low)), bool)
    strip = max(1, _STRIP // max(1, out.shape[1]))
    for start in range(0, out.shape[0], strip):
        if check is not None:
            check()
        end = start + strip
        sampled = (across[ry_low[start:end]] * wy_low[start:end, None]
                   + across[ry_high[start:end]] * wy_high[start:end, None])  # fmt: skip
        out[start:end] = sampled > np.float32(0.5)
    return Placed(x0, y0, out)
