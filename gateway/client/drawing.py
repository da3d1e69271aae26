"""`--draw`: the image with a task's result drawn on it, by the task's own drawing (its
binding's `draw`, on a gateway.imaging.sketch Sketch; Pillow, imported only when drawing); a
pipeline's answer as its first step's task draws it, with what the steps attached to each
instance captioned under the instance's label."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.api.bindings import Binding, Bindings
from gateway.client.pipelines import captions, first_answer
from gateway.imaging.sketch import DRAW_COLOUR, Sketch

__all__ = ["DRAW_COLOUR", "draw", "draw_path", "draw_pipeline"]


def draw(image: bytes, result: dict[str, Any], out: Path, binding: Binding) -> None:
    """Writes the image (as a viewer shows it: EXIF orientation applied, like the gateway's
    pixels) with `result` (a result of `binding`'s task, as plain data) drawn on it;
    ValueError for a task that draws nothing."""
    if binding.draw is None:
        raise ValueError(f"task {binding.verb} has no drawing; leave out --draw")
    sketch = Sketch(image)
    binding.draw(sketch, result)
    sketch.save(out)


def draw_pipeline(image: bytes, result: Mapping[str, Any], out: Path, bindings: Bindings) -> None:
    """Writes the image with a pipeline's answer (a PipelineResult as plain data: result_dict)
    drawn on it: the first step's answer as its task draws it (its boxes when the task draws
    nothing), then under each instance's label one caption per step that attached a result
    to it, in the steps' order ("colour: red 0.97"; gateway.client.pipelines.captions)."""
    binding, answer, instances = first_answer(result, bindings)
    sketch = Sketch(image)
    if binding.draw is not None:
        binding.draw(sketch, answer)
    else:
        for instance in instances:
            sketch.box(instance["box"])
    order = [step["name"] for step in result.get("steps", [])]
    for attached in result.get("instances", []):
        index = attached.get("id", 0)
        if not 0 <= index < len(instances):
            continue
        box = instances[index]["box"]
        for line, text in enumerate(captions(attached.get("steps", {}), order), 1):
            sketch.label(text, box["x_min"], box["y_min"], under=line)
    sketch.save(out)


def draw_path(out: Path, index: int, count: int) -> Path:
    """OUT.png for one image; OUT-0.png, OUT-1.png, ... for several."""
    return out if count == 1 else out.with_name(f"{out.stem}-{index}{out.suffix}")
