"""Each task's page renderer (gateway/tasks/<task>/page.js) in a real browser (headless
chromium): the page, rendered in-process with bindings that carry the five renderers, draws a
given result JSON over a given image (the page's own `show`, as after an answer of the
gateway); the canvas is read back and compared with what the JSON says. The renderers' JSON
shapes are those of issue 34 (proto field names, as the HTTP door answers). Masks in COCO RLE
come from pycocotools itself (in the zoo's venv, `make zoo-venv`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw

from gateway.api.bindings import Binding, page_script
from gateway.frontends.http import page
from gateway.frontends.http.page import BOX_COLOUR
from gateway.models import default_registry
from gateway.tasks.builtin import BUILT_IN
from tests.support import tools
from tests.support.browser import Shown, show_result, with_page

ROOT = Path(__file__).resolve().parents[3]
ZOO_PYTHON = ROOT / ".venv-zoo" / "bin" / "python"
TASKS = ROOT / "gateway" / "tasks"
# folder: (task, verb), as issue 34 names them
RENDERED = {
    "detection": ("detection", "detect"),
    "classification": ("classification", "classify"),
    "segmentation": ("instance_segmentation", "segment"),
    "keypoints": ("keypoints", "keypoints"),
    "embedding": ("embedding", "embed"),
}
GREY = (128, 128, 128)
BOX_RGB = np.array([int(BOX_COLOUR[i : i + 2], 16) for i in (1, 3, 5)])
MODEL = {"name": "m", "version": "1"}


def bindings(**pages: str) -> list[Binding]:
    """A binding per task folder with its page.js (the contract's fields only matter here:
    task, verb, page), or the page given for a verb ("" for none)."""
    base = BUILT_IN.for_task("detection")
    return [
        dataclasses.replace(
            base,
            task=task,
            verb=verb,
            page=pages.get(verb, page_script(str(TASKS / folder / "binding.py"))),
        )
        for folder, (task, verb) in RENDERED.items()
    ]


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("page") / "page.html"
    path.write_text(page.render(default_registry("detector", default_task="detection"), bindings()))
    return path.as_uri()


def grey_png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), GREY).save(out, format="PNG")
    return out.getvalue()


def draw(
    browser: str, url: str, verb: str, result: dict[str, Any], png: bytes, mime: str = "image/png"
) -> Shown:
    async def work(tab: Any) -> Shown:
        return await show_result(tab, url, verb, result, png, mime)

    shown: Shown = asyncio.run(with_page(browser, work))
    return shown


def changed(pixels: np.ndarray) -> np.ndarray:
    return np.abs(pixels - np.array(GREY)).sum(axis=-1) > 0


def is_box(pixels: np.ndarray) -> np.ndarray:
    return np.abs(pixels - BOX_RGB).sum(axis=-1) < 60


def instance(box: tuple[int, int, int, int], **fields: Any) -> dict[str, Any]:
    x0, y0, x1, y1 = box
    return {
        "box": {"x_min": x0, "y_min": y0, "x_max": x1, "y_max": y1},
        "class_id": 1,
        "label": "thing",
        "score": 0.9,
        **fields,
    }


def result(width: int, height: int, **fields: Any) -> dict[str, Any]:
    return {
        "image_width": width,
        "image_height": height,
        "model": MODEL,
        "request_id": "r",
        **fields,
    }


def coco_rle(masks: list[np.ndarray], tmp_path: Path) -> list[dict[str, Any]]:
    """pycocotools.mask.encode of each mask: {"size": [h, w], "counts": "<string>"}."""
    if not ZOO_PYTHON.exists():
        tools.missing(str(ZOO_PYTHON), "run `make zoo-venv` (make test does): pycocotools")
    np.save(tmp_path / "masks.npy", np.stack(masks).astype(np.uint8))
    script = (
        "import json, sys, numpy as np; from pycocotools import mask\n"
        "masks = np.load(sys.argv[1])\n"
        "out = [mask.encode(np.asfortranarray(m)) for m in masks]\n"
        "print(json.dumps([{'size': r['size'], 'counts': r['counts'].decode()} for r in out]))\n"
    )
    run = subprocess.run(
        [str(ZOO_PYTHON), "-c", script, str(tmp_path / "masks.npy")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return list(json.loads(run.stdout))


def grow(mask: np.ndarray) -> np.ndarray:
    """`mask` and its pixels' 8 neighbours."""
    padded = np.pad(mask, 1)
    height, width = mask.shape
    return np.logical_or.reduce(
        [padded[dy : dy + height, dx : dx + width] for dy in range(3) for dx in range(3)]
    )


def shrink(mask: np.ndarray) -> np.ndarray:
    return ~grow(~mask)


def outside_drawings(shape: tuple[int, int], instances: list[dict[str, Any]]) -> np.ndarray:
    """Where neither a box's outline (2 px inside its edges, +1 for antialiasing) nor a label
    (16 px high, at most 120 wide, above the box) is drawn."""
    free = np.ones(shape, bool)
    for found in instances:
        b = found["box"]
        x0, y0, x1, y1 = b["x_min"], b["y_min"], b["x_max"], b["y_max"]
        ring = np.zeros(shape, bool)
        ring[max(y0 - 1, 0) : y1 + 1, max(x0 - 1, 0) : x1 + 1] = True
        ring[y0 + 3 : y1 - 3, x0 + 3 : x1 - 3] = False
        free &= ~ring
        top = y0 - 16 if y0 >= 16 else y0
        free[max(top - 1, 0) : top + 17, max(x0 - 1, 0) : x0 + 120] = False
    return free


# --- segmentation: masks ----------------------------------------------------------------------


def known_masks(height: int, width: int) -> list[np.ndarray]:
    """A ring with a square beside it; a noisy blob (hundreds of runs, negative deltas); an L
    from the image's first pixel (an RLE whose first run, of zeros, is empty)."""
    y, x = np.mgrid[:height, :width]
    distance = (y - 80) ** 2 + (x - 70) ** 2
    ring = (distance <= 40**2) & (distance > 15**2)
    ring |= (y >= 60) & (y < 90) & (x >= 120) & (x < 140)
    noise = np.random.default_rng(3).random((height, width)) < 0.5
    noise &= (y >= 130) & (y < 190) & (x >= 180) & (x < 300)
    corner = ((y < 25) & (x < 60)) | ((y < 180) & (x < 12))
    return [ring, noise, corner]


MASK_BOXES = [(24, 34, 146, 126), (174, 124, 306, 196), (0, 0, 66, 186)]


def check_masks(shown: Shown, masks: list[np.ndarray], found: list[dict[str, Any]]) -> None:
    assert shown.state == "done", shown.status
    assert shown.status == f"{len(masks)} instances by m version 1"
    free = outside_drawings(masks[0].shape, found)
    union = np.logical_or.reduce(masks)
    # Every pixel left to compare (most of each mask) is painted iff a mask holds it.
    assert (free & union).sum() > 0.8 * union.sum()
    assert all((free & m).sum() > 0.4 * m.sum() for m in masks)
    np.testing.assert_array_equal(changed(shown.pixels) & free, union & free)
    # Each instance in its own colour.
    colours = [tuple(np.median(shown.pixels[m & free], axis=0)) for m in masks]
    assert len(set(colours)) == len(masks), colours
    for row, m in zip(shown.rows, masks, strict=True):
        assert row == f"thing 0.900, mask of {int(m.sum())} pixels"


def test_segmentation_draws_pycocotools_rle_masks_pixel_for_pixel(
    browser, page_url: str, tmp_path: Path
) -> None:
    height, width = 200, 320  # not square: rows and columns cannot be swapped unseen
    masks = known_masks(height, width)
    rles = coco_rle(masks, tmp_path)
    assert rles[2]["counts"][0] == "0"  # the corner mask's first run (of zeros) is empty
    found = [
        instance(box, mask={**rle, "polygons": []})
        for box, rle in zip(MASK_BOXES, rles, strict=True)
    ]
    shown = draw(browser, page_url, "segment", result(width, height, instances=found),
                 grey_png(width, height))  # fmt: skip
    check_masks(shown, masks, found)


def test_segmentation_draws_uncompressed_rle_and_png_masks(browser, page_url: str) -> None:
    height, width = 200, 320
    masks = known_masks(height, width)
    # pycocotools' uncompressed form: the runs as numbers (column-major, zeros first).
    flat = masks[0].T.reshape(-1).astype(int)
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    counts = runs if flat[0] == 0 else [0, *runs]
    pngs = []
    for m in masks[1:]:
        out = io.BytesIO()
        Image.fromarray(m).convert("1").save(out, format="PNG")
        png = base64.b64encode(out.getvalue()).decode()
        pngs.append({"size": [height, width], "png": png, "polygons": []})
    found = [
        instance(box, mask=m)
        for box, m in zip(
            MASK_BOXES,
            [{"size": [height, width], "counts": counts, "polygons": []}, *pngs],
            strict=True,
        )
    ]
    shown = draw(browser, page_url, "segment", result(width, height, instances=found),
                 grey_png(width, height))  # fmt: skip
    check_masks(shown, masks, found)


@pytest.mark.parametrize("form", ["lists", "points"])
def test_segmentation_fills_polygons_with_their_holes(browser, page_url: str, form: str) -> None:
    height, width = 200, 320
    outer, hole = [30, 30, 200, 40, 150, 170], [100, 70, 140, 70, 140, 100, 100, 100]
    polygons = [outer, hole] if form == "lists" else [{"points": outer}, {"points": hole}]
    found = [instance((20, 25, 210, 180), mask={"size": [height, width], "polygons": polygons})]
    shown = draw(browser, page_url, "segment", result(width, height, instances=found),
                 grey_png(width, height))  # fmt: skip
    assert shown.state == "done", shown.status
    expected = Image.new("1", (width, height))
    ImageDraw.Draw(expected).polygon(outer, fill=1)
    ImageDraw.Draw(expected).polygon(hole, fill=0)
    wanted = np.asarray(expected)
    free = outside_drawings((height, width), found)
    painted = changed(shown.pixels) & free
    # As Pillow fills them, but for the pixels their edges cross.
    assert (painted & free).sum() > 0.9 * wanted.sum()
    assert not (shrink(wanted) & free & ~painted).any()
    assert not (painted & ~grow(wanted)).any()
    assert not painted[85, 120]  # inside the hole


def test_segmentation_fills_outlines_along_pixel_edges_exactly(browser, page_url: str) -> None:
    """Outlines along pixel edges (as segmentation.v1 writes them), filled even-odd: exactly
    the mask's pixels, the hole left out."""
    outline = [40, 40, 120, 40, 120, 80, 80, 80, 80, 120, 40, 120]  # an L
    hole = [50, 50, 60, 50, 60, 65, 50, 65]
    polygons = [{"points": outline}, {"points": hole}]
    found = [instance((30, 30, 130, 130), mask={"size": [160, 200], "polygons": polygons})]
    shown = draw(browser, page_url, "segment", result(200, 160, instances=found),
                 grey_png(200, 160))  # fmt: skip
    assert shown.state == "done", shown.status
    y, x = np.mgrid[:160, :200]
    wanted = (x >= 40) & (y >= 40) & (((x < 120) & (y < 80)) | ((x < 80) & (y < 120)))
    wanted &= ~((x >= 50) & (x < 60) & (y >= 50) & (y < 65))
    free = outside_drawings((160, 200), found)
    np.testing.assert_array_equal(changed(shown.pixels) & free, wanted & free)
    assert shown.rows == [f"thing 0.900, mask of {int(wanted.sum())} pixels"]


def test_segmentation_reports_a_malformed_mask(browser, page_url: str) -> None:
    found = [instance((10, 10, 50, 50), mask={"size": [100, 100], "counts": "0P1"})]
    shown = draw(browser, page_url, "segment", result(100, 100, instances=found),
                 grey_png(100, 100))  # fmt: skip
    assert shown.state == "error"
    assert shown.status.startswith("instance 0 (thing): a mask's RLE covers"), shown.status
    assert "its size 100x100 has 10000" in shown.status


# --- keypoints --------------------------------------------------------------------------------


def test_keypoints_draws_the_points_and_skeleton_that_score_enough(browser, page_url: str) -> None:
    points = [
        {"name": "nose", "x": 100.0, "y": 60.0, "score": 0.9},
        {"name": "neck", "x": 100.0, "y": 120.0, "score": 0.8},
        {"name": "hip", "x": 160.0, "y": 150.0, "score": 0.7},
        {"name": "knee", "x": 220.0, "y": 150.0, "score": 0.2},  # under 0.5: not drawn
    ]
    edges = [{"start": 0, "end": 1}, {"start": 1, "end": 2}, {"start": 2, "end": 3}]
    found = [instance((40, 30, 260, 200), keypoints=points, label="person")]
    shown = draw(browser, page_url, "keypoints",
                 result(320, 240, instances=found, skeleton=edges), grey_png(320, 240))  # fmt: skip
    assert shown.state == "done", shown.status
    box = is_box(shown.pixels)
    for p in points[:3]:
        assert box[int(p["y"]), int(p["x"])], p
    assert not changed(shown.pixels)[145:156, 215:226].any()  # the knee
    assert box[90, 100] and box[135, 130]  # along nose-neck and neck-hip
    assert not changed(shown.pixels)[150, 190:210].any()  # no hip-knee edge
    assert shown.rows == ["person 0.900: 3 of 4 keypoints scoring 0.5 or more (nose, neck, hip)"]
    assert shown.status == "1 instances by m version 1"
    # Without a skeleton: the points only.
    shown = draw(browser, page_url, "keypoints", result(320, 240, instances=found),
                 grey_png(320, 240))  # fmt: skip
    assert is_box(shown.pixels)[120, 100] and not changed(shown.pixels)[90, 100]


# --- embedding, detection, classification, none -----------------------------------------------


def test_embedding_lists_its_dimension_norm_and_first_values(browser, page_url: str) -> None:
    vector = [0.6, 0.8] + [0.0] * 8
    answer = result(64, 48, embedding=vector, dimension=10, normalized=True)
    shown = draw(browser, page_url, "embed", answer, grey_png(64, 48))
    assert shown.state == "done", shown.status
    assert shown.rows == [
        "dimension 10",
        "L2 norm 1.0000 (normalized)",
        "first values 0.6000, 0.8000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, ...",
    ]
    assert shown.status == "Embedding of dimension 10 by m version 1"
    assert not changed(shown.pixels).any()  # nothing drawn over the image
    answer = result(64, 48, embedding=[3.0, 4.0], dimension=2, normalized=False)
    shown = draw(browser, page_url, "embed", answer, grey_png(64, 48))
    assert shown.rows[1:] == [
        "L2 norm 5.0000 (as the model gave it)",
        "first values 3.0000, 4.0000",
    ]


def test_detection_and_classification_renderers(browser, page_url: str) -> None:
    found = [instance((20, 40, 120, 140)), instance((200, 30, 300, 90), label="other")]
    shown = draw(browser, page_url, "detect", result(320, 200, detections=found),
                 grey_png(320, 200))  # fmt: skip
    assert shown.state == "done", shown.status
    box = is_box(shown.pixels)
    for d in found:
        b = d["box"]
        assert box[(b["y_min"] + b["y_max"]) // 2, b["x_min"]]
        assert box[b["y_max"] - 1, (b["x_min"] + b["x_max"]) // 2]
    assert not changed(shown.pixels)[160:, :].any()
    assert shown.rows == [
        "thing 0.900 at (20, 40)-(120, 140)",
        "other 0.900 at (200, 30)-(300, 90)",
    ]
    assert shown.status == "2 detections by m version 1"
    classes = [
        {"class_id": 2, "label": "blue", "score": 0.8},
        {"class_id": 0, "label": "red", "score": 0.2},
    ]
    shown = draw(
        browser, page_url, "classify", result(100, 100, classes=classes), grey_png(100, 100)
    )
    assert shown.rows == ["blue 0.800", "red 0.200"]
    assert is_box(shown.pixels[:10, :10]).any() and not changed(shown.pixels[30:]).any()


def test_an_image_the_browser_cannot_show_gets_a_blank_canvas(browser, page_url: str) -> None:
    """The gateway reads TIFF; chromium does not: the result is drawn on a blank canvas of the
    result's size, and the status says so."""
    out = io.BytesIO()
    Image.new("RGB", (160, 120), GREY).save(out, format="TIFF")
    answer = result(160, 120, detections=[instance((20, 30, 100, 90))])
    shown = draw(browser, page_url, "detect", answer, out.getvalue(), "image/tiff")
    assert shown.state == "done", shown.status
    assert shown.status == (
        "1 detections by m version 1 (this browser cannot show the image: drawn on a blank)"
    )
    assert shown.pixels.shape == (120, 160, 3)
    assert is_box(shown.pixels)[60, 20] and (shown.pixels[110, 150] == 224).all()


def test_a_task_without_a_renderer_shows_its_json(browser, tmp_path: Path) -> None:
    html = tmp_path / "page.html"
    html.write_text(
        page.render(default_registry("detector", default_task="detection"), bindings(segment=""))
    )
    answer = result(64, 48, instances=[instance((1, 1, 30, 30))])
    shown = draw(browser, html.as_uri(), "segment", answer, grey_png(64, 48))
    assert shown.state == "done", shown.status
    assert shown.status == "Result by m version 1 (the JSON is below)"
    assert json.loads(shown.raw) == answer
    assert not changed(shown.pixels).any() and shown.rows == []
