"""`--draw` for keypoints: each instance's box and label, its skeleton's edges between the
points both ends of which were found, and the points."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.imaging.sketch import Sketch
from gateway.tasks.detection.drawing import draw_boxes


def draw(sketch: Sketch, result: Mapping[str, Any]) -> None:
    instances = result.get("instances", [])
    edges = [(edge["start"], edge["end"]) for edge in result.get("skeleton", [])]
    for instance in instances:
        points = instance.get("keypoints", [])
        for a, b in edges:
            if a < len(points) and b < len(points):
                sketch.line([(points[a]["x"], points[a]["y"]), (points[b]["x"], points[b]["y"])])
        for point in points:
            sketch.point(point["x"], point["y"])
    draw_boxes(sketch, instances)
