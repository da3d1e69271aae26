"""`--draw`: the image with a task's result drawn on it, by the task's own drawing (its
binding's `draw`, on a gateway.imaging.sketch Sketch; Pillow, imported only when drawing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.api.bindings import Binding
from gateway.imaging.sketch import DRAW_COLOUR, Sketch

__all__ = ["DRAW_COLOUR", "draw", "draw_path"]


def draw(image: bytes, result: dict[str, Any], out: Path, binding: Binding) -> None:
    """Writes the image (as a viewer shows it: EXIF orientation applied, like the gateway's
    pixels) with `result` (a result of `binding`'s task, as plain data) drawn on it;
    ValueError for a task that draws nothing."""
    if binding.draw is None:
        raise ValueError(f"task {binding.verb} has no drawing; leave out --draw")
    sketch = Sketch(image)
    binding.draw(sketch, result)
    sketch.save(out)


def draw_path(out: Path, index: int, count: int) -> Path:
    """OUT.png for one image; OUT-0.png, OUT-1.png, ... for several."""
    return out if count == 1 else out.with_name(f"{out.stem}-{index}{out.suffix}")
