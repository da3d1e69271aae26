"""A shadow candidate's instances compared with the current model's (Task.compare): matched
as detection matches boxes (same class, box IoU >= 0.5, greedy), giving precision, recall and
score deltas; and per matched pair the IoU of the two masks, averaged as `mask_iou` (1.0 with
no pair). Masks are compared in the form both answers hold: RLE on its runs (no pixels made:
the runs' boundaries merged, O(runs log runs)), PNG decoded; polygon answers give no
`mask_iou`. The answers are bounded by the model's max_answer_bytes, so is this."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from gateway.domain import Comparison
from gateway.tasks.detection.compare import box_iou, match, matched, same_class
from gateway.tasks.segmentation.nouns import Instance, Mask, Segments


def rle_runs(counts: str) -> np.ndarray:
    """The run lengths of a COCO compressed RLE string (pycocotools' rleFrString, vectorised
    over the characters: 5-bit groups, least significant first, 0x20 marking that more follow,
    0x10 of the last the sign; from the fourth count on, the difference from the count two
    before)."""
    c = np.frombuffer(counts.encode("ascii"), np.uint8).astype(np.int64) - 48
    if c.size == 0:
        return np.zeros(0, np.int64)
    last = np.flatnonzero((c & 0x20) == 0)
    starts = np.concatenate(([0], last[:-1] + 1))
    group = np.repeat(np.arange(len(starts)), last - starts + 1)
    k = np.arange(len(c)) - starts[group]
    x = np.add.reduceat((c & 0x1F) << (5 * k), starts)
    negative = (c[last] & 0x10) != 0
    x[negative] -= np.left_shift(1, 5 * (last - starts + 1)[negative])
    if len(x) > 3:
        odd = x[1::2].copy()
        x[1::2] = np.cumsum(odd)
        even = x[2::2].copy()
        x[2::2] = np.cumsum(even)
    return x


def rle_iou(a: str, b: str) -> float:
    """IoU of two RLE masks of one image, from their runs (boundaries merged)."""
    ends_a, ends_b = np.cumsum(rle_runs(a)), np.cumsum(rle_runs(b))
    points = np.union1d(np.concatenate(([0], ends_a)), np.concatenate(([0], ends_b)))
    starts, lengths = points[:-1], np.diff(points)
    # A segment [p, q) is inside a mask when an odd number of its run ends lie at or before p.
    in_a = np.searchsorted(ends_a, starts, side="right") % 2 == 1
    in_b = np.searchsorted(ends_b, starts, side="right") % 2 == 1
    union = int(lengths[in_a | in_b].sum())
    return int(lengths[in_a & in_b].sum()) / union if union else 1.0


def _png_bits(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("1"), bool)


def mask_iou(a: Mask, b: Mask) -> float | None:
    """IoU of two masks in one form (None: polygons, or forms that differ)."""
    if a.counts is not None and b.counts is not None:
        return rle_iou(a.counts, b.counts)
    if a.png is not None and b.png is not None:
        x, y = _png_bits(a.png), _png_bits(b.png)
        if x.shape != y.shape:
            return 0.0
        union = int(np.count_nonzero(x | y))
        return int(np.count_nonzero(x & y)) / union if union else 1.0
    return None


def _boxes(instances: list[Instance]) -> np.ndarray:
    return np.array([i.box for i in instances], np.float64).reshape(-1, 4)


def compare_segments(current: Segments, candidate: Segments) -> Comparison:
    ours, theirs = current.instances, candidate.instances
    classes = same_class([(i.class_id, i.label) for i in ours],
                         [(i.class_id, i.label) for i in theirs])  # fmt: skip
    pairs = match(np.where(classes, box_iou(_boxes(ours), _boxes(theirs)), 0.0))
    ious = [mask_iou(ours[i].mask, theirs[j].mask) for i, j in pairs]
    known = [v for v in ious if v is not None]
    extra = {}
    if known or not pairs:
        extra["mask_iou"] = float(np.mean(known)) if known else 1.0
    return matched("instance_segmentation", pairs, [i.score for i in ours],
                   [i.score for i in theirs], extra)  # fmt: skip
