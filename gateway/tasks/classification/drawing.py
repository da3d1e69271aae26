"""`--draw` for classification: the classes with their scores, one row each from the top."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.imaging.sketch import Sketch


def draw(sketch: Sketch, result: Mapping[str, Any]) -> None:
    for rank, scored in enumerate(result.get("classes", [])):
        sketch.row(rank, f"{scored['label']} {scored['score']:.3f}")
