"""GET / in a real headless browser (Debian's chromium), driven over the DevTools protocol.

The page loads a sample image (a data: URL in `?image=`), posts it to the gateway, and draws
the detections; the test screenshots the canvas and finds the box colour along every edge
the JSON names, and nowhere far from the boxes. A classifier's top classes and an embedding's
figures are listed (each task's renderer alone: test_page_renderers.py). Skipped, saying why,
only when chromium is not installed (`make pytest` installs it when run as root).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image

from gateway.frontends.http.page import BOX_COLOUR
from serving import scenes
from serving.reference import CLASSIFIER_PALETTE, read_labels
from tests.support.browser import Page, Shown, run_page, with_page
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

BOX_RGB = np.array([int(BOX_COLOUR[i : i + 2], 16) for i in (1, 3, 5)])


def page_url(gateway: GatewayProcess, image: bytes, mime: str, model: str) -> str:
    data = f"data:{mime};base64,{base64.b64encode(image).decode()}"
    return f"{gateway.http_url}/?" + urllib.parse.urlencode({"model": model, "image": data})


async def _canvas_screenshot(page: Page) -> tuple[np.ndarray, dict[str, Any]]:
    info = await page.evaluate(
        "(() => { const c = document.getElementById('canvas'); const r = c.getBoundingClientRect();"
        " return {x: r.left + c.clientLeft, y: r.top + c.clientTop, width: c.width,"
        " height: c.height, cssWidth: c.clientWidth,"
        " raw: document.getElementById('raw').textContent,"
        " rows: [...document.querySelectorAll('#rows li')].map(li => li.textContent),"
        " status: document.getElementById('status').textContent}; })()"
    )
    assert info["cssWidth"] == info["width"], "the canvas is scaled; the test needs 1:1"
    shot = await page.send(
        "Page.captureScreenshot",
        format="png",
        clip={
            "x": info["x"],
            "y": info["y"],
            "width": info["width"],
            "height": info["height"],
            "scale": 1,
        },
    )
    image = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    return np.asarray(image).astype(int), info


def is_box(pixels: np.ndarray) -> np.ndarray:
    return np.abs(pixels - BOX_RGB).sum(axis=-1) < 60


def test_page_draws_the_detections_where_the_json_says(http_gateway, browser, tmp_path) -> None:
    scene = scenes.generate_scene(
        np.random.default_rng(5), 640, 480, 4, background=(128, 128, 128), min_side=60
    )
    picked = tmp_path / "scene.png"
    picked.write_bytes(scenes.encode(scene.pixels, "PNG"))

    async def work(page: Page) -> tuple[str, np.ndarray, dict[str, Any]]:
        state = await page.pick_file(f"{http_gateway.http_url}/?model=detector", picked)
        pixels, info = await _canvas_screenshot(page)
        return state, pixels, info

    state, pixels, info = asyncio.run(with_page(browser, work))
    assert state == "done", info["status"]
    result = json.loads(info["raw"])
    assert pixels.shape == (480, 640, 3)
    assert len(result["detections"]) == len(scene.boxes) == 4
    box_mask = is_box(pixels)
    # Labels (box colour with white text) sit above each box's top-left corner, or inside
    # it at the image's top: 13 px text in a 17 px strip, at most 160 px wide here.
    labels = np.zeros(box_mask.shape, bool)
    for d in result["detections"]:
        x0, y0 = d["box"]["x_min"], d["box"]["y_min"]
        top = y0 - 17 if y0 >= 17 else y0
        labels[top : top + 17, x0 : x0 + 160] = True
    near = np.zeros(box_mask.shape, bool)
    for d in result["detections"]:
        b = d["box"]
        x0, y0, x1, y1 = b["x_min"], b["y_min"], b["x_max"], b["y_max"]
        # The stroke runs just inside the box: all four edges are the box colour along
        # their length (within 3 px), except where a label covers them.
        checked = 0
        for edge, free in (
            (box_mask[y0:y1, x0 : x0 + 3].any(axis=1), ~labels[y0:y1, x0]),
            (box_mask[y0:y1, x1 - 3 : x1].any(axis=1), ~labels[y0:y1, x1 - 1]),
            (box_mask[y0 : y0 + 3, x0:x1].any(axis=0), ~labels[y0, x0:x1]),
            (box_mask[y1 - 3 : y1, x0:x1].any(axis=0), ~labels[y1 - 1, x0:x1]),
        ):
            if free.sum() >= 10:
                assert edge[free].mean() > 0.95, d
                checked += 1
        assert checked >= 3, d
        # Inside, below the label, the painted rectangle shows through.
        assert not box_mask[(y0 + y1) // 2 + 5, (x0 + x1) // 2], d
        near[max(y0 - 40, 0) : y1 + 4, max(x0 - 4, 0) : x1 + 200] = True
    # Far from every box (and its label), no box colour at all.
    assert not box_mask[~near].any()
    assert "4 detections by detector version 1" in info["status"]


def test_page_lists_the_top_classes_of_a_classifier(http_gateway, browser) -> None:
    pixels = np.zeros((100, 100, 3), np.uint8)
    pixels[:80] = (20, 20, 240)
    pixels[80:] = (240, 20, 20)
    png = scenes.encode(pixels, "PNG")

    async def work(page: Page) -> tuple[str, np.ndarray, dict[str, Any]]:
        state = await page.run(page_url(http_gateway, png, "image/png", "colours"))
        shot, info = await _canvas_screenshot(page)
        return state, shot, info

    state, shot, info = asyncio.run(with_page(browser, work))
    assert state == "done", info["status"]
    assert info["rows"][:2] == ["blue 0.800", "red 0.200"]
    assert json.loads(info["raw"])["classes"][0]["label"] == "blue"
    assert is_box(shot[:10, :10]).any()  # the top class's label drawn in the corner


def test_page_offers_the_options_of_the_chosen_model_s_task(http_gateway, browser) -> None:
    """An input per request option of the model's task (from its binding), sent with the image;
    a value typed in stays when the next model's task has the option too."""
    pixels = np.zeros((100, 100, 3), np.uint8)
    pixels[:80] = (20, 20, 240)
    pixels[80:] = (240, 20, 20)
    png = scenes.encode(pixels, "PNG")
    inputs = "[...document.querySelectorAll('#options [name]')].map((i) => [i.name, i.value])"

    async def work(page: Page) -> tuple[Shown, list[list[str]], list[list[str]]]:
        url = http_gateway.http_url
        shown = await run_page(page, url, "colours", png, "image/png", top_k="1", min_score="0.1")
        before = await page.evaluate(inputs)
        await page.evaluate("select.value = 'detector'; select.dispatchEvent(new Event('change'))")
        return shown, before, await page.evaluate(inputs)

    shown, before, after = asyncio.run(with_page(browser, work))
    assert shown.state == "done", shown.status
    assert shown.rows == ["blue 0.800"]  # top_k = 1
    assert before == [["top_k", "1"], ["min_score", "0.1"]]
    assert after == [["min_score", "0.1"], ["max_detections", ""]]


def test_page_shows_the_gateway_s_error(http_gateway, browser) -> None:
    async def work(page: Page) -> tuple[str, str]:
        state = await page.run(page_url(http_gateway, b"not an image", "image/png", "detector"))
        return state, await page.evaluate("document.getElementById('status').textContent")

    state, status = asyncio.run(with_page(browser, work))
    assert state == "error"
    assert status.startswith("INVALID_ARGUMENT: image data could not be decoded"), status


# --- an embedding model's page ----------------------------------------------------------------
# The reference `classifier_scores` served as an embedding model: its float [1, 8] output is the
# share of the image's pixels nearest to each palette colour, so for an image of palette colours
# the vector is known (the shares over their L2 norm).
EMBEDDING_CONFIG = """
default_model = "classifier_scores"
[models.classifier_scores]
task = "embedding"
[models.classifier_scores.input]
scale = 0.00392156862745098
"""


@pytest.fixture(scope="module")
def embedding_gateway(
    http_tfs: LocalServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("page-embedding")
    (root / "gateway-models.toml").write_text(EMBEDDING_CONFIG)
    args = [f"--model-config={root / 'gateway-models.toml'}"]
    with run_gateway(http_tfs.target, args, log_dir=root, http=True) as gateway:
        yield gateway


def test_page_shows_an_embedding_s_dimension_norm_and_first_values(
    embedding_gateway: GatewayProcess, browser
) -> None:
    labels = read_labels()
    pixels = np.zeros((224, 224, 3), np.uint8)  # the model's size: the shares stay exact
    pixels[:, :168] = CLASSIFIER_PALETTE[labels[0]]
    pixels[:, 168:] = CLASSIFIER_PALETTE[labels[1]]
    png = scenes.encode(pixels, "PNG")
    vector = np.zeros(len(labels))
    vector[:2] = 0.75, 0.25
    vector /= np.linalg.norm(vector)

    async def work(page: Page) -> Shown:
        return await run_page(
            page, embedding_gateway.http_url, "classifier_scores", png, "image/png"
        )

    shown = asyncio.run(with_page(browser, work))
    assert shown.state == "done", shown.status
    assert shown.status == "Embedding of dimension 8 by classifier_scores version 1"
    assert shown.rows == [
        "dimension 8",
        "L2 norm 1.0000 (normalized)",
        "first values " + ", ".join(f"{v:.4f}" for v in vector),
    ]
    np.testing.assert_allclose(json.loads(shown.raw)["embedding"], vector, atol=1e-6)
    # Nothing drawn over the image.
    assert (shown.pixels == pixels).all()
