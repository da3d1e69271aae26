"""The embedding task's plain types: the caller's options and the result."""

from __future__ import annotations

from typing import Annotated, NamedTuple


class EmbedOptions(NamedTuple):
    """As the caller gave them; 0 keeps every dimension."""

    dimensions: Annotated[
        int,
        "leading values kept before normalising, for Matryoshka-trained models (0: all)",
    ] = 0


class Embedding(NamedTuple):
    vector: list[float]
    normalized: bool  # divided by its L2 norm (false: normalize = false, or the zero vector)
