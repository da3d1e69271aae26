"""`--draw` for embeddings: a vector has no place in the picture; its size and first values
are written on it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gateway.imaging.sketch import Sketch


def draw(sketch: Sketch, result: Mapping[str, Any]) -> None:
    vector = result.get("embedding", [])
    norm = math.sqrt(sum(v * v for v in vector))
    sketch.row(0, f"embedding of {len(vector)} values, norm {norm:.3f}")
    sketch.row(1, " ".join(f"{v:+.3f}" for v in vector[:6]) + (" ..." if len(vector) > 6 else ""))
