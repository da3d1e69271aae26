"""Box-relative masks pasted into pixels of the image as a viewer shows it: the transforms'
axis maps, the paste's sampling and zero border, and EXIF orientation and letterboxing giving
exactly the oriented / scaled paste."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from gateway.core.letterbox import unletterbox
from gateway.imaging.orientation import orient_box
from gateway.tasks.segmentation import raster
from gateway.tasks.segmentation.raster import Axis, Shape

# numpy's view of each EXIF orientation: the displayed image from the stored one.
ORIENTED = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.T,
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].T,
    8: lambda a: np.rot90(a, 1),
}


def _whole(placed: raster.Placed, width: int, height: int) -> np.ndarray:
    out = np.zeros((height, width), bool)
    h, w = placed.bits.shape
    out[placed.y0 : placed.y0 + h, placed.x0 : placed.x0 + w] = placed.bits
    return out


def _box_shape(grid: np.ndarray, box: tuple[float, float, float, float]) -> Shape:
    ymin, xmin, ymax, xmax = box
    ch, cw = (ymax - ymin) / grid.shape[0], (xmax - xmin) / grid.shape[1]
    return Shape(grid, box, (ymin - ch, xmin - cw, ymax + ch, xmax + cw), False)


def test_axes_of_no_transform_orientations_and_letterboxing() -> None:
    assert raster.raster_axes(None) == (Axis(0, 0.0, 1.0), Axis(1, 0.0, 1.0))
    assert raster.raster_axes(partial(orient_box, orientation=6)) == (
        Axis(1, 0.0, 1.0), Axis(0, 1.0, -1.0)
    )  # fmt: skip
    rows, cols = raster.raster_axes(partial(unletterbox, y_scale=2.0, x_scale=1.25))
    assert rows == Axis(0, 0.0, 2.0) and cols == Axis(1, 0.0, 1.25)
    with pytest.raises(ValueError, match="not an axis-aligned"):
        raster.raster_axes(lambda b: (b[0] + b[1], b[1], b[2] + b[3], b[3]))


def test_a_full_grid_covers_the_pixels_whose_centres_are_in_the_box() -> None:
    box = (10.2 / 50, 5.6 / 40, 30.4 / 50, 20.5 / 40)  # pixels: y 10.2..30.4, x 5.6..20.5
    placed = raster.paste(_box_shape(np.ones((3, 3)), box), raster.raster_axes(None), 40, 50,
                          0.5)  # fmt: skip
    mask = _whole(placed, 40, 50)
    expected = np.zeros((50, 40), bool)
    expected[10:30, 6:20] = True  # centres 10.5..29.5, 6.5..19.5
    assert np.array_equal(mask[20], expected[20]) and np.array_equal(mask[:, 12], expected[:, 12])
    assert not (mask & ~expected).any()
    # Bilinear in both axes: a corner pixel samples under half of each edge's value, so the
    # corners round off (as resizing the padded mask does in Model Garden's paste).
    assert not mask[10, 6] and not mask[29, 19] and mask[12:28, 8:18].all()


def test_the_zero_border_fades_over_one_cell() -> None:
    # One 10-pixel cell of 1.0 over x 10..20 of a 40 px row: a pixel centre at d pixels
    # outside the box samples 0.5 - d / 10 (half a cell to the centre of the zero border).
    box = (0.0, 10 / 40, 1.0, 20 / 40)
    axes = raster.raster_axes(None)
    for threshold, first, last in ((0.5, 10, 20), (0.25, 8, 22), (0.05, 6, 24)):
        placed = raster.paste(_box_shape(np.ones((1, 1)), box), axes, 40, 1, threshold)
        row = _whole(placed, 40, 1)[0]
        assert list(np.flatnonzero(row)) == list(range(first, last)), threshold


def test_bilinear_between_cells() -> None:
    # Cells 0 | 1 over x 0..20: the centre of pixel x samples g = (x + 0.5) / 10 - 0.5.
    grid = np.array([[0.0, 1.0]])
    placed = raster.paste(_box_shape(grid, (0.0, 0.0, 1.0, 20 / 40)), raster.raster_axes(None),
                          40, 1, 0.5)  # fmt: skip
    # 0 to 1 between the cells' centres (x 5, 15), 1 to 0 over the border past x 20.
    assert list(np.flatnonzero(_whole(placed, 40, 1)[0])) == list(range(10, 20))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_an_exif_orientation_gives_the_oriented_paste(orientation: int) -> None:
    rng = np.random.default_rng(orientation)
    grid = rng.random((7, 5))
    stored_w, stored_h = 37, 23
    box = (0.13, 0.21, 0.87, 0.66)
    plain = _whole(raster.paste(_box_shape(grid, box), raster.raster_axes(None), stored_w,
                                stored_h, 0.5), stored_w, stored_h)  # fmt: skip
    assert 0 < np.count_nonzero(plain) < plain.size
    shown_w, shown_h = (stored_h, stored_w) if orientation >= 5 else (stored_w, stored_h)
    axes = raster.raster_axes(partial(orient_box, orientation=orientation))
    turned = raster.paste(_box_shape(grid, box), axes, shown_w, shown_h, 0.5)
    assert np.array_equal(_whole(turned, shown_w, shown_h), ORIENTED[orientation](plain))


def test_letterboxing_scales_the_paste_back_to_the_image() -> None:
    # Content 60x30 at the top left of a 60x60 canvas, shown 120x60: canvas y in [0, 0.5] is
    # the image's height.
    axes = raster.raster_axes(partial(unletterbox, y_scale=2.0, x_scale=1.0))
    box = (0.1, 0.25, 0.35, 0.75)  # canvas fractions -> image y 0.2..0.7, x 0.25..0.75
    mask = _whole(raster.paste(_box_shape(np.ones((4, 4)), box), axes, 120, 60, 0.5), 120, 60)
    expected = np.zeros((60, 120), bool)
    expected[12:42, 30:90] = True
    assert np.array_equal(mask[27], expected[27]) and np.array_equal(mask[:, 60], expected[:, 60])
    assert not (mask & ~expected).any() and mask[14:40, 32:88].all()


def test_a_box_off_the_image_is_cut_at_its_edges_and_memory_stays_in_the_box() -> None:
    box = (-0.5, 0.5, 0.5, 1.5)  # the top right quarter is on the image
    placed = raster.paste(_box_shape(np.ones((2, 2)), box), raster.raster_axes(None), 20, 10,
                          0.5)  # fmt: skip
    # Only pixels the box and its zero border cover on the image are computed.
    assert (placed.x0, placed.y0) == (0, 0) and placed.bits.shape == (10, 20)
    mask = _whole(placed, 20, 10)
    assert not mask[5:].any() and not mask[:, :10].any() and mask[:4, 11:].all()
    empty = raster.paste(_box_shape(np.ones((2, 2)), (2.0, 2.0, 3.0, 3.0)),
                         raster.raster_axes(None), 20, 10, 0.5)  # fmt: skip
    assert empty.bits.size == 0
