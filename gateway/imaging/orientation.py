"""EXIF orientation: stored pixels as a viewer shows them, and boxes found on the stored
image mapped to the shown one."""

from __future__ import annotations

import numpy as np
from PIL import Image

# The same mapping ImageOps.exif_transpose uses, so our pixels match Pillow's.
TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def oriented_view(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """The stored pixels as a viewer shows them (the transposes of TRANSPOSE), as a view."""
    if orientation >= 5:  # 5..8 swap rows and columns first
        pixels = pixels.transpose(1, 0, 2)
    flip_rows, flip_columns = _FLIPS[orientation]
    return pixels[:: -1 if flip_rows else 1, :: -1 if flip_columns else 1]


# EXIF orientation -> (flip rows, flip columns), applied after the transpose of 5..8.
_FLIPS = {
    1: (False, False),
    2: (False, True),
    3: (True, True),
    4: (True, False),
    5: (False, False),
    6: (False, True),
    7: (True, True),
    8: (True, False),
}


def orient_box(
    box: tuple[float, float, float, float], orientation: int
) -> tuple[float, float, float, float]:
    """Map a normalized (ymin, xmin, ymax, xmax) box from the stored image to the displayed one.

    Used when the model saw the stored pixels (TF Serving ignores EXIF) but the caller sees the
    image as a viewer shows it; matches ImageOps.exif_transpose for orientations 1..8.
    """
    ymin, xmin, ymax, xmax = box
    if orientation == 1:
        return ymin, xmin, ymax, xmax
    if orientation == 2:  # mirrored left-right
        return ymin, 1 - xmax, ymax, 1 - xmin
    if orientation == 3:  # rotated 180°
        return 1 - ymax, 1 - xmax, 1 - ymin, 1 - xmin
    if orientation == 4:  # mirrored top-bottom
        return 1 - ymax, xmin, 1 - ymin, xmax
    if orientation == 5:  # transposed: x and y swap
        return xmin, ymin, xmax, ymax
    if orientation == 6:  # displayed rotated 90° clockwise
        return xmin, 1 - ymax, xmax, 1 - ymin
    if orientation == 7:  # transversed: flipped about the anti-diagonal
        return 1 - xmax, 1 - ymax, 1 - xmin, 1 - ymin
    if orientation == 8:  # displayed rotated 90° counter-clockwise
        return 1 - xmax, ymin, 1 - xmin, ymax
    raise ValueError(f"EXIF orientation must be 1..8, got {orientation}")
