"""Reading the masks segmentation.v1 answers with, independently of the gateway's code: COCO
compressed RLE decoded as pycocotools' rleFrString and rleDecode define it, polygons filled
with the even-odd rule at pixel centres, PNG read with Pillow; and the IoU of two masks."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image


def rle_counts(text: str) -> list[int]:
    """pycocotools' rleFrString: 5-bit groups from '0', 0x20 = more, 0x10 on the last =
    negative; from the fourth count on, a difference from the count two before."""
    counts: list[int] = []
    p = 0
    while p < len(text):
        x = k = 0
        more = True
        while more:
            c = ord(text[p]) - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def rle_decode(size: Sequence[int], counts: str) -> np.ndarray:
    """[h, w] bool from COCO RLE: runs over the pixels in column-major order, zeros first."""
    height, width = size
    runs = rle_counts(counts)
    assert sum(runs) == height * width, (sum(runs), height, width)
    flat = np.zeros(height * width, bool)
    position = 0
    for i, run in enumerate(runs):
        assert run >= 0
        if i % 2:
            flat[position : position + run] = True
        position += run
    return flat.reshape(width, height).T


def polygons_mask(polygons: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    """[h, w] bool: pixel centres inside the polygons by the even-odd rule (a ray to the
    right from each centre crosses an odd number of edges)."""
    ys = np.arange(height)[:, None] + 0.5
    xs = np.arange(width)[None, :] + 0.5
    inside = np.zeros((height, width), bool)
    for polygon in polygons:
        points = np.asarray(polygon, np.float64).reshape(-1, 2)
        for (x1, y1), (x2, y2) in zip(points, np.roll(points, -1, axis=0), strict=True):
            if y1 == y2:
                continue
            crosses = (ys >= min(y1, y2)) & (ys < max(y1, y2))
            x_at = x1 + (ys - y1) * (x2 - x1) / (y2 - y1)
            inside ^= crosses & (xs < x_at)
    return inside


def png_mask(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("L")) > 0


def decode(mask: Mapping[str, Any]) -> np.ndarray:
    """A segmentation.v1 Mask in proto JSON (every field present) as [h, w] bool."""
    height, width = mask["size"]
    if mask.get("counts") is not None:
        return rle_decode(mask["size"], mask["counts"])
    if mask.get("png"):
        data = mask["png"]
        return png_mask(base64.b64decode(data) if isinstance(data, str) else data)
    return polygons_mask([p["points"] for p in mask["polygons"]], height, width)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else np.count_nonzero(a & b) / union
