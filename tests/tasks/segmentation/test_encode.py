"""Masks written as COCO compressed RLE (byte for byte pycocotools' strings, recorded from
pycocotools.mask.encode 2.0.11 in .venv-zoo), as
polygons along pixel edges (filled even-odd, exactly the mask) and as 1-bit PNG."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.tasks.segmentation import encode
from gateway.tasks.segmentation.raster import Placed
from tests.support import masks


def _l_shape() -> np.ndarray:
    a = np.zeros((6, 5), bool)
    a[1:5, 1:4] = True
    a[1:3, 3] = False
    return a


def _random() -> np.ndarray:
    return np.random.default_rng(7).random((9, 7)) < 0.5


def _tall() -> np.ndarray:
    c = np.zeros((3000, 40), bool)
    c[100:2900, 5:30] = True
    c[200:300, 10:12] = False
    return c


def _corner() -> np.ndarray:
    b = np.zeros((5, 5), bool)
    b[4, 4] = True
    return b


# pycocotools.mask.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"] for each.
PYCOCOTOOLS = [
    (_l_shape, "74202N3"),
    (lambda: np.ones((4, 3), bool), "0<"),
    (lambda: np.zeros((3, 4), bool), "<"),
    (_random, "311070I10O022ON01OO1120MO20N023NM"),
    (_corner, "h01"),
    (_tall, "lg>`g2X600000000d[MlLT^2T3laMlLT^2T3X60000000000000000000000000000000000\\Vm0"),
]


def _whole(mask: np.ndarray) -> Placed:
    return Placed(0, 0, mask)


def _tight(mask: np.ndarray) -> Placed:
    """Only the mask's bounding box, as the paste gives it."""
    ys, xs = np.nonzero(mask)
    if len(ys) == 0:
        return Placed(0, 0, np.zeros((0, 0), bool))
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    return Placed(int(x0), int(y0), mask[y0:y1, x0:x1])


@pytest.mark.parametrize("make, expected", PYCOCOTOOLS)
@pytest.mark.parametrize("place", [_whole, _tight])
def test_rle_is_what_pycocotools_writes(make, expected, place) -> None:  # type: ignore[no-untyped-def]
    mask = make()
    height, width = mask.shape
    got = encode.rle_string(encode.rle_counts(place(mask), width, height))
    assert got == expected
    assert np.array_equal(masks.rle_decode([height, width], got), mask)


def test_rle_of_random_crops_decodes_to_the_mask() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        height, width = (int(v) for v in rng.integers(1, 30, 2))
        h, w = int(rng.integers(0, height + 1)), int(rng.integers(0, width + 1))
        y0, x0 = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        bits = rng.random((h, w)) < rng.random()
        whole = np.zeros((height, width), bool)
        whole[y0 : y0 + h, x0 : x0 + w] = bits
        counts = encode.rle_counts(Placed(x0, y0, bits), width, height)
        assert sum(counts) == height * width and min(counts) >= 0
        assert all(c > 0 for c in counts[1:])  # only the first run (of zeros) may be empty
        assert np.array_equal(masks.rle_decode([height, width], encode.rle_string(counts)), whole)


def test_polygons_fill_exactly_the_mask_holes_and_diagonals_included() -> None:
    rng = np.random.default_rng(5)
    shapes = [_l_shape(), _corner(), np.ones((4, 6), bool)]
    ring = np.ones((7, 7), bool)
    ring[2:5, 2:5] = False  # a hole
    ring[3, 3] = True  # an island in the hole
    shapes.append(ring)
    checker = np.indices((6, 6)).sum(axis=0) % 2 == 0  # pixels touching at corners only
    shapes.append(checker)
    shapes += [rng.random((12, 9)) < 0.5 for _ in range(20)]
    for mask in shapes:
        height, width = mask.shape
        placed = _tight(mask)
        outlines = encode.polygons(placed)
        assert np.array_equal(masks.polygons_mask(outlines, height, width), mask)
        assert sum(len(o) // 2 for o in outlines) <= encode.boundary_edges(placed)
    square = encode.polygons(Placed(3, 2, np.ones((2, 4), bool)))
    assert len(square) == 1 and sorted(zip(square[0][::2], square[0][1::2], strict=True)) == [
        (3, 2), (3, 4), (7, 2), (7, 4)
    ]  # fmt: skip
    assert encode.polygons(Placed(0, 0, np.zeros((3, 3), bool))) == []


def test_png_is_the_mask_over_the_whole_image() -> None:
    mask = _l_shape()
    data = encode.png(_tight(mask), 5, 6)
    assert data.startswith(b"\x89PNG")
    assert np.array_equal(masks.png_mask(data), mask)
    import io

    from PIL import Image

    assert Image.open(io.BytesIO(data)).mode == "1"
