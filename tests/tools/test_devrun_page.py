"""`make run`'s page (http://localhost:HTTP_PORT/) draws the answers of its reference
segmenter, keypoint model and embedder, in headless chromium, the canvas read back against
the JSON the page drew (the shapes picture as a PNG, so the browser's pixels are the file's)."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
from PIL import Image

from serving import scenes
from tests.support import masks
from tests.support.browser import Page, Shown, run_page, with_page
from tests.support.makerun import MakeRun

pytestmark = pytest.mark.slow

# 320 x 240: the picture travels in the page's URL (a data: URL), which the door takes up to
# 8 KiB long.
SHAPES = scenes.shapes_scene(320, 240)
PNG = scenes.encode(SHAPES.pixels, "PNG")


def show(make_run: MakeRun, browser: str, model: str, **options: str) -> Shown:
    async def work(page: Page) -> Shown:
        return await run_page(page, make_run.http, model, PNG, "image/png", **options)

    shown = asyncio.run(with_page(browser, work))
    assert shown.state == "done", shown.status
    return shown


def outlines_and_labels(instances: list[dict]) -> np.ndarray:
    """Where the page draws each instance's box outline and label (as tests/frontends/http
    /test_page_tasks.py measures them)."""
    y, x = np.mgrid[: SHAPES.height, : SHAPES.width]
    drawn = np.zeros(y.shape, bool)
    for instance in instances:
        b = instance["box"]
        x0, y0, x1, y1 = b["x_min"], b["y_min"], b["x_max"], b["y_max"]
        ring = (x >= x0 - 1) & (x < x1 + 1) & (y >= y0 - 1) & (y < y1 + 1)
        ring &= ~((x >= x0 + 3) & (x < x1 - 3) & (y >= y0 + 3) & (y < y1 - 3))
        # The label sits above the box, or inside its top when the box is near the top edge.
        drawn |= ring | ((y >= y0 - 17) & (y < y0 + 18) & (x >= x0 - 1) & (x < x0 + 120))
    return drawn


def test_page_draws_the_segmenter_masks(make_run: MakeRun, browser: str) -> None:
    shown = show(make_run, browser, "maskrcnn", mask_format="rle")
    assert shown.status == "4 instances by maskrcnn version 1"
    found = json.loads(shown.raw)["instances"]
    union = np.zeros((SHAPES.height, SHAPES.width), bool)
    for instance in found:
        mask = masks.decode(instance["mask"])
        shape = scenes.shape_masks(SHAPES.width, SHAPES.height)[instance["class_id"]]
        # 33 x 33 cells over shapes 40-80 px across (the ring thinnest): IoU 0.94 at worst.
        assert masks.iou(mask, shape) > 0.9
        union |= mask
    # The overlay covers the masks' pixels and no others (the ring's hole stays as it was),
    # but where the boxes' outlines and labels are drawn.
    drawn = outlines_and_labels(found)
    changed = np.abs(shown.pixels - SHAPES.pixels.astype(int)).sum(axis=-1) > 0
    np.testing.assert_array_equal(changed & ~drawn, union & ~drawn)


def test_page_draws_the_stick_figures(make_run: MakeRun, browser: str) -> None:
    shown = show(make_run, browser, "pose")
    assert shown.status == "4 instances by pose version 1"
    answer = json.loads(shown.raw)
    assert answer["skeleton"] and len(answer["instances"]) == 4
    # Every keypoint is drawn over the picture (in the outline's colour, over the shapes'
    # colours): the canvas differs from the picture there.
    changed = np.abs(shown.pixels - SHAPES.pixels.astype(int)).sum(axis=-1) > 60
    for instance in answer["instances"]:
        assert instance["label"] == "person" and len(instance["keypoints"]) == 17
        for point in instance["keypoints"]:
            assert changed[round(point["y"]), round(point["x"])], point


def test_page_shows_the_embedding(make_run: MakeRun, browser: str) -> None:
    shown = show(make_run, browser, "embedder")
    assert shown.status == "Embedding of dimension 48 by embedder version 1"
    assert shown.rows[:2] == ["dimension 48", "L2 norm 1.0000 (normalized)"]
    # The picture is shown as it is.
    original = np.asarray(Image.open(io.BytesIO(PNG)).convert("RGB")).astype(int)
    assert shown.pixels.shape == original.shape
