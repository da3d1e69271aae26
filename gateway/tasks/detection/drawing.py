"""`--draw` for detection (and the tasks built on it): each box, then its label and score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.imaging.sketch import Sketch


def draw_boxes(sketch: Sketch, found: Sequence[Mapping[str, Any]]) -> None:
    """Boxes first, then labels: a label is never hidden under another instance's box."""
    for item in found:
        sketch.box(item["box"])
    for item in found:
        box = item["box"]
        sketch.label(f"{item['label']} {item['score']:.2f}", box["x_min"], box["y_min"])


def draw(sketch: Sketch, result: Mapping[str, Any]) -> None:
    draw_boxes(sketch, result.get("detections", []))
