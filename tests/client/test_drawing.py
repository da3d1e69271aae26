"""`--draw`: each built-in task draws its own result (its binding's `draw`) on the picture as a
viewer shows it: boxes and labels, classes in rows, keypoints and their skeleton, masks in any
of their three forms tinted exactly over their pixels; a task that draws nothing is refused."""

from __future__ import annotations

import base64
import dataclasses
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from gateway.client.cli import main as client_main
from gateway.client.drawing import draw
from gateway.imaging.sketch import DRAW_COLOUR
from gateway.tasks.builtin import BUILT_IN
from gateway.tasks.segmentation import encode
from gateway.tasks.segmentation.raster import Placed

GREY = (100, 100, 100)
W, H = 200, 120


def picture() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((H, W, 3), GREY, np.uint8)).save(out, "PNG")
    return out.getvalue()


def drawn(verb: str, result: dict[str, Any], tmp_path: Path) -> np.ndarray:
    out = tmp_path / f"{verb}.png"
    draw(picture(), result, out, BUILT_IN.for_verb(verb))
    return np.asarray(Image.open(out).convert("RGB"))


def is_colour(pixel: np.ndarray) -> bool:
    return tuple(int(v) for v in pixel) == DRAW_COLOUR


def found(x0: int, y0: int, x1: int, y1: int, **more: Any) -> dict[str, Any]:
    box = {"x_min": x0, "y_min": y0, "x_max": x1, "y_max": y1}
    return {"box": box, "label": "thing", "score": 0.9, "class_id": 1, **more}


def test_detection_draws_each_box_and_leaves_its_inside(tmp_path: Path) -> None:
    pixels = drawn("detect", {"detections": [found(40, 50, 120, 110)]}, tmp_path)
    assert is_colour(pixels[80, 40]) and is_colour(pixels[80, 119]) and is_colour(pixels[109, 80])
    assert tuple(pixels[80, 80]) == GREY and tuple(pixels[5, 190]) == GREY


def test_classification_writes_its_classes_from_the_top(tmp_path: Path) -> None:
    result = {"classes": [{"label": "cat", "score": 0.7, "class_id": 3}]}
    pixels = drawn("classify", result, tmp_path)
    assert is_colour(pixels[2, 1]) and tuple(pixels[H - 5, W - 5]) == GREY


def test_embedding_writes_its_size(tmp_path: Path) -> None:
    pixels = drawn("embed", {"embedding": [0.6, 0.8], "dimension": 2}, tmp_path)
    assert is_colour(pixels[2, 1]) and tuple(pixels[H - 5, W - 5]) == GREY


def test_keypoints_draws_points_and_the_skeleton_between_them(tmp_path: Path) -> None:
    points = [
        {"name": "a", "x": 150.0, "y": 60.0, "score": 0.9},
        {"name": "b", "x": 190.0, "y": 60.0, "score": 0.9},
        {"name": "c", "x": 150.0, "y": 100.0, "score": 0.9},
    ]
    result = {
        "instances": [found(140, 50, 195, 110, keypoints=points)],
        "skeleton": [{"start": 0, "end": 1}],
    }
    pixels = drawn("keypoints", result, tmp_path)
    assert is_colour(pixels[100, 150])  # a point with no edge
    assert is_colour(pixels[60, 170])  # on the edge a-b
    assert tuple(pixels[80, 170]) == GREY  # no edge a-c or b-c was asked for


def square_mask() -> np.ndarray:
    mask = np.zeros((H, W), bool)
    mask[30:70, 60:100] = True
    mask[45:55, 75:85] = False  # a hole
    return mask


def as_json(mask: np.ndarray, form: str) -> dict[str, Any]:
    placed = Placed(0, 0, mask)
    if form == "rle":
        return {"size": [H, W], "counts": encode.rle_string(encode.rle_counts(placed, W, H))}
    if form == "png":
        return {"size": [H, W], "png": base64.b64encode(encode.png(placed, W, H)).decode()}
    polygons = [{"points": p} for p in encode.polygons(placed)]
    return {"size": [H, W], "polygons": polygons}


@pytest.mark.parametrize("form", ["rle", "polygon", "png"])
def test_segmentation_tints_exactly_its_masks_pixels(form: str, tmp_path: Path) -> None:
    mask = square_mask()
    # The box lies off the mask, its label above it: only the mask's pixels change inside.
    result = {"instances": [found(150, 80, 190, 115, mask=as_json(mask, form))]}
    pixels = drawn("segment", result, tmp_path)
    region = (slice(20, 80), slice(50, 110))
    tinted = np.any(pixels[region] != GREY, axis=2)
    assert np.array_equal(tinted, mask[region])


def test_a_task_that_draws_nothing_is_refused_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = tmp_path / "grey.png"
    image.write_bytes(picture())
    plain = BUILT_IN.for_verb("embed")
    bindings = type(BUILT_IN)([*(b for b in BUILT_IN if b is not plain),
                               dataclasses.replace(plain, draw=None)])  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        client_main([str(image), "--task=embed", f"--draw={tmp_path / 'x.png'}",
                     "--target=127.0.0.1:1"], bindings)  # fmt: skip
    assert refused.value.code == 2
    assert "task embed has no drawing; leave out --draw" in capsys.readouterr().err
