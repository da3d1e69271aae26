"""Pictures of vertical stripes in the reference classifiers' palette colours, and the share of
each colour they hold: what the reference classifier_scores model outputs for them, exactly
(serving.reference); for the embedding and added-task tests."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from serving.reference import CLASSIFIER_PALETTE, read_labels

LABELS = read_labels()
SIDE = 224  # the model's input size: the image reaches it unresized, its shares exact
IMAGE = ((LABELS[0], 168), (LABELS[1], 56))  # 3/4 and 1/4 of the first two classes
OTHER = ((LABELS[2], SIDE),)


def stripes(*shares: tuple[str, int], fmt: str = "PNG") -> bytes:
    """A SIDE x SIDE image of vertical stripes: (palette colour, columns) from the left."""
    pixels = np.zeros((SIDE, SIDE, 3), np.uint8)
    left = 0
    for colour, columns in shares:
        pixels[:, left : left + columns] = CLASSIFIER_PALETTE[colour]
        left += columns
    assert left == SIDE
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def shares(*stripes: tuple[str, int]) -> np.ndarray:
    vector = np.zeros(len(LABELS))
    for colour, columns in stripes:
        vector[LABELS.index(colour)] = columns / SIDE
    return vector


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)
