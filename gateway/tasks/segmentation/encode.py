"""A placed mask (gateway.tasks.segmentation.raster.Placed) written as the caller asked:
COCO compressed RLE, polygons along pixel edges, or a 1-bit PNG.

RLE is what pycocotools.mask.encode writes (its C code, common/maskApi.c: rleEncode counts
runs over the mask in column-major order, first a run of zeros, possibly empty; rleToString
writes each count, from the fourth on as the difference from the count two before, in
5-bit groups, least significant first, as characters from '0', 0x20 marking that more
follow and 0x10 the sign of the last group). Computed from the box's pixels only: the image
outside is zeros.
"""

from __future__ import annotations

import io
import time
from collections import defaultdict

import numpy as np
from PIL import Image

from gateway.tasks.segmentation.raster import Placed

# Tracing is Python holding the GIL (~4 us an edge): every this many edges (~1 ms) the thread
# gives the GIL up, so the event loop waits about that long for it, not the interpreter's
# 5 ms switch interval each time it wakes (a Detect beside a polygon answer keeps its latency).
YIELD_STEPS = 256


def rle_counts(placed: Placed, width: int, height: int) -> list[int]:
    """The run lengths of the mask over the width x height image, column-major, starting
    with a run of zeros (as pycocotools' rleEncode)."""
    bits = placed.bits
    total = width * height
    if not bits.any():
        return [total]
    h, w = bits.shape
    columns = np.zeros((w, h + 2), np.int8)
    columns[:, 1:-1] = bits.T
    column, row = np.nonzero(np.diff(columns, axis=1))
    # Where runs of ones start and end (alternately), as column-major pixel positions.
    edges = (placed.x0 + column).astype(np.int64) * height + placed.y0 + row
    # A run ending at the bottom of one column and one starting at the top of the next are one.
    joined = np.flatnonzero(edges[1:] == edges[:-1])
    if len(joined):
        edges = np.delete(edges, np.concatenate([joined, joined + 1]))
    counts = np.diff(edges, prepend=0, append=total).tolist()
    if counts[-1] == 0:  # the mask runs to the last pixel: no run of zeros after it
        counts.pop()
    return counts


def rle_string(counts: list[int]) -> str:
    """pycocotools' rleToString of `counts` (vectorized over the counts: one pass per 5-bit
    group)."""
    if not counts:
        return ""
    x = np.asarray(counts, np.int64)
    if len(x) > 3:
        x[3:] -= np.asarray(counts[1:-2], np.int64)
    groups = np.zeros((len(x), 13), np.uint8)  # 13 groups of 5 bits hold any int64
    writing = np.ones(len(x), bool)
    length = np.zeros(len(x), np.int64)
    for k in range(groups.shape[1]):
        c = x & 0x1F
        x >>= 5
        more = np.where(c & 0x10, x != -1, x != 0)
        groups[:, k] = (c | np.where(more, 0x20, 0)) + 48
        length += writing
        writing &= more
        if not writing.any():
            break
    used = np.arange(groups.shape[1]) < length[:, None]
    return groups[used].tobytes().decode("ascii")


def boundary_edges(placed: Placed) -> int:
    """How many pixel edges the mask's outlines have (a polygon has at most as many
    vertices): known before tracing them."""
    padded = np.pad(placed.bits, 1)
    return int(
        np.count_nonzero(np.diff(padded, axis=0)) + np.count_nonzero(np.diff(padded, axis=1))
    )


def polygons(placed: Placed) -> list[list[float]]:
    """The mask's outlines along pixel edges, [x0, y0, x1, y1, ...] each, in pixels of the
    image (vertices only where an outline turns). Outer outlines and holes alike: filled
    with the even-odd rule they give the mask's pixels exactly."""
    bits = placed.bits
    if not bits.any():
        return []
    padded = np.pad(bits, 1)
    inside = padded[1:-1, 1:-1]
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    # Each boundary edge of a pixel (x, y) directed with the mask on the same side:
    # top (x+1, y) -> (x, y), left (x, y) -> (x, y+1), bottom (x, y+1) -> (x+1, y+1),
    # right (x+1, y+1) -> (x+1, y).
    sides = (
        (padded[:-2, 1:-1], (1, 0), (0, 0)),
        (padded[1:-1, :-2], (0, 0), (0, 1)),
        (padded[2:, 1:-1], (0, 1), (1, 1)),
        (padded[1:-1, 2:], (1, 1), (1, 0)),
    )
    for neighbour, (sx, sy), (ex, ey) in sides:
        ys, xs = np.nonzero(inside & ~neighbour)
        starts.append(np.stack([xs + sx, ys + sy], axis=1))
        ends.append(np.stack([xs + ex, ys + ey], axis=1))
    stride = bits.shape[1] + 2
    start_keys = _keys(np.concatenate(starts), stride)
    end_keys = _keys(np.concatenate(ends), stride)
    following: dict[int, list[int]] = defaultdict(list)
    for start, end in zip(start_keys.tolist(), end_keys.tolist(), strict=True):
        following[start].append(end)
    outlines: list[list[float]] = []
    steps = 0
    while following:
        first = next(iter(following))
        loop = [first]
        vertex = first
        while True:
            steps += 1
            if steps % YIELD_STEPS == 0:
                time.sleep(0)  # let the event loop's thread have the GIL (see YIELD_STEPS)
            nexts = following[vertex]
            step = nexts.pop()
            if not nexts:
                del following[vertex]
            vertex = step
            if vertex == first:
                break
            loop.append(vertex)
        outlines.append(_simplified(np.asarray(loop), stride, placed.x0, placed.y0))
    return outlines


def _keys(points: np.ndarray, stride: int) -> np.ndarray:
    return points[:, 1].astype(np.int64) * stride + points[:, 0]


def _simplified(loop: np.ndarray, stride: int, x0: int, y0: int) -> list[float]:
    xy = np.stack([loop % stride + x0, loop // stride + y0], axis=1)
    before = xy - np.roll(xy, 1, axis=0)
    after = np.roll(xy, -1, axis=0) - xy
    turns = np.any(np.sign(before) != np.sign(after), axis=1)
    return xy[turns].astype(np.float64).reshape(-1).tolist()


def png(placed: Placed, width: int, height: int) -> bytes:
    """A 1-bit greyscale PNG of the width x height image, white inside the mask."""
    image = np.zeros((height, width), bool)
    h, w = placed.bits.shape
    image[placed.y0 : placed.y0 + h, placed.x0 : placed.x0 + w] = placed.bits
    out = io.BytesIO()
    # zlib level 1: a few times faster than the default 6 on noisy masks, a few % larger.
    Image.fromarray(image).save(out, format="PNG", compress_level=1)
    return out.getvalue()
