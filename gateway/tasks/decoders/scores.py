"""Class scores: probabilities as they are, or logits through softmax or sigmoid."""

from __future__ import annotations

import numpy as np

ACTIVATIONS = ("softmax", "sigmoid")


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x), without overflow warnings for large negative x."""
    out = np.empty_like(logits, dtype=np.float64)
    positive = logits >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-logits[positive]))
    e = np.exp(logits[~positive])
    out[~positive] = e / (1.0 + e)
    return out


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """Scores in [0, 1] from logits: softmax (one class per image) or sigmoid (multi-label)."""
    if activation == "softmax":
        return softmax(logits)
    if activation == "sigmoid":
        return sigmoid(logits)
    raise ValueError(f"unknown activation {activation!r}")
