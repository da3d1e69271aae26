"""`--draw` for instance segmentation: each instance's mask tinted over the picture (from
whichever form the answer holds: COCO compressed RLE, polygons or PNG), then its box and
label."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gateway.imaging.sketch import Sketch
from gateway.tasks.detection.drawing import draw_boxes


def draw(sketch: Sketch, result: Mapping[str, Any]) -> None:
    instances = result.get("instances", [])
    for instance in instances:
        # No mask: a model without masks (the answer then has none, as the HTTP door's).
        covered = mask_pixels(instance.get("mask", {}), sketch.height, sketch.width)
        if covered is not None:
            sketch.mask(covered)
    draw_boxes(sketch, instances)


def mask_pixels(mask: Mapping[str, Any], height: int, width: int) -> np.ndarray | None:
    """[height, width] bool of a segmentation.v1 mask as JSON; None when it is of another
    size than the picture (nothing to place it on)."""
    if list(mask.get("size", [])) != [height, width]:
        return None
    if mask.get("counts"):
        return _from_rle(mask["counts"], height, width)
    if mask.get("png"):
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(base64.b64decode(mask["png"]))).convert("1"))
    return _from_polygons([p["points"] for p in mask.get("polygons", [])], height, width)


def _from_rle(text: str, height: int, width: int) -> np.ndarray:
    """COCO compressed RLE (pycocotools' string form): runs over the pixels column by
    column, background first; each count in 5-bit groups from '0' (0x20: more follow, 0x10
    on the last: negative), from the third on a difference from the count two before."""
    counts: list[int] = []
    value = shift = 0
    for char in text.encode():
        group = char - 48
        value |= (group & 0x1F) << shift
        shift += 5
        if group & 0x20:
            continue
        if group & 0x10:
            value -= 1 << shift
        if len(counts) > 2:
            value += counts[-2]
        counts.append(value)
        value = shift = 0
    runs = np.asarray(counts, np.int64)
    flat = np.repeat(np.arange(len(runs)) % 2 == 1, runs)[: height * width]
    flat = np.pad(flat, (0, height * width - flat.size))
    return flat.reshape(width, height).T


def _from_polygons(polygons: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    """The pixels whose centres the outlines enclose by the even-odd rule (a hole's outline
    inside its shape's), as the task defines its polygons: a ray to the right of a centre
    crosses an odd number of edges. Each edge flips every centre right of where it crosses
    the centre's row; the flips add up along the row."""
    flips = np.zeros((height, width + 1), np.uint8)
    centres = np.arange(height) + 0.5
    for polygon in polygons:
        points = np.asarray(polygon, np.float64).reshape(-1, 2)
        for (xa, ya), (xb, yb) in zip(points, np.roll(points, -1, axis=0), strict=True):
            if ya == yb:
                continue
            rows = np.nonzero((centres >= min(ya, yb)) & (centres < max(ya, yb)))[0]
            crossing = xa + (centres[rows] - ya) * (xb - xa) / (yb - ya)
            first = np.clip(np.ceil(crossing - 0.5), 0, width).astype(np.int64)
            np.bitwise_xor.at(flips, (rows, first), 1)
    return (np.bitwise_xor.accumulate(flips, axis=1)[:, :width] & 1).astype(bool)
