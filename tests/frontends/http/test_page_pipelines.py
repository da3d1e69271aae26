"""The page runs a pipeline (gateway/frontends/http/page.js, showPipeline) in headless chromium:
make run's `detect_then_classify` on the reference models (the reference detector, then
classifier_scores on each box's crop), drawn as the detector's page draws the boxes, with each
box's attached class captioned under its label; and a given answer with a failed crop, a
vector and an answer of several instances, captioned as the client's --draw captions them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.client.pipelines import captions
from gateway.frontends.http import page as page_html
from gateway.models import default_registry
from gateway.tasks.builtin import BUILT_IN
from serving import scenes
from tests.support.browser import Page, Shown, read, show_result, with_page
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

ROOT = Path(__file__).resolve().parents[3]
PIPELINE = "detect_then_classify"
# The page's label size for a 640-pixel-wide image (makeView: max(12, width / 50)), and the
# line a caption takes (a label and a gap of 2).
SIZE = 13
LINE = SIZE + 6


def make_run_pipelines() -> str:
    """The [pipelines] of make run's model config (serving/gateway-models.toml), as written."""
    text = (ROOT / "serving" / "gateway-models.toml").read_text()
    return text[text.index("[pipelines.") :]


@pytest.fixture(scope="module")
def pipeline_gateway(
    http_tfs: LocalServer, http_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """The door's models (the reference detector and classifiers among them) with make run's
    pipeline."""
    assert (http_repo / "classifier_scores" / "1").is_dir(), "make run's step model"
    directory = tmp_path_factory.mktemp("page-pipelines")
    config = directory / "gateway-models.toml"
    models = (http_repo / "gateway-models.toml").read_text()
    config.write_text(models + "\n" + make_run_pipelines())
    args = [f"--model-config={config}"]
    with run_gateway(http_tfs.target, args, log_dir=directory, http=True) as gateway:
        yield gateway


def changed_outside(a: np.ndarray, b: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    return np.any(a != b, axis=-1) & ~allowed


def test_the_page_runs_make_run_s_pipeline_and_captions_each_box(
    pipeline_gateway: GatewayProcess, browser: str, tmp_path: Path
) -> None:
    scene = scenes.generate_scene(
        np.random.default_rng(5), 640, 480, 4, background=(128, 128, 128), min_side=60
    )
    picked = tmp_path / "scene.png"  # picked as a file: too large for a data: URL
    picked.write_bytes(scenes.encode(scene.pixels, "PNG"))
    url = pipeline_gateway.http_url

    async def work(page: Page) -> tuple[Shown, Shown, Any]:
        await page.pick_file(f"{url}/?pipeline={PIPELINE}", picked)
        piped = await read(page)
        offered = await page.evaluate(
            "[...document.querySelectorAll('#model optgroup option')]"
            ".map((o) => [o.value, o.textContent, o.selected])"
        )
        palette = await page.evaluate("PALETTE")
        await page.pick_file(f"{url}/?model=detector&min_score=0.5", picked)
        return piped, await read(page), (offered, palette)

    piped, alone, (offered, palette) = asyncio.run(with_page(browser, work))
    assert piped.state == "done", piped.status
    assert offered == [
        [f"pipeline:{PIPELINE}", f"{PIPELINE}: detector, then colour (classifier_scores)", True]
    ]
    result = json.loads(piped.raw)
    assert result["pipeline"] == PIPELINE
    detections = result["detections"]["detections"]
    assert len(detections) == 4
    assert piped.status == (
        f"Pipeline {PIPELINE}: 4 detections by detector version 1; colour: 4 crops by "
        "classifier_scores version 1"
    )
    # The detector's own rows, then one per box with its class (the palette colour the
    # reference classifier names for the rectangle's crop).
    assert piped.rows[:4] == alone.rows
    expected = []
    for instance, found in zip(result["instances"], detections, strict=True):
        top = instance["steps"]["colour"]["classes"]["classes"][0]
        assert top["label"] == found["label"].removesuffix(" box")
        expected.append(f"#{instance['id']} {found['label']}: colour: {top['label']} "
                        f"{top['score']:.2f}")  # fmt: skip
    assert piped.rows[4:] == expected
    # The same drawing as the detector's page, but for one caption under each box's label,
    # in the instance's colour: the line under the label, at most 200 px wide.
    captioned = np.zeros(piped.pixels.shape[:2], bool)
    for index, found in enumerate(detections):
        box = found["box"]
        top = (box["y_min"] - LINE if box["y_min"] >= LINE else box["y_min"]) + LINE
        captioned[top : top + SIZE + 4, box["x_min"] : box["x_min"] + 200] = True
        colour = np.array([int(palette[index][i : i + 2], 16) for i in (1, 3, 5)])
        band = piped.pixels[top + 1 : top + SIZE + 3, box["x_min"] + 1 : box["x_min"] + 40]
        assert (np.abs(band - colour).sum(axis=-1) < 30).mean() > 0.4, found
    assert not changed_outside(piped.pixels, alone.pixels, captioned).any()


def answer(steps: list[dict[str, Any]], instances: list[dict[str, Any]]) -> dict[str, Any]:
    """A pipeline's answer (as the HTTP door writes it) over two detections."""
    boxes = [(40, 60, 200, 220), (300, 10, 500, 200)]
    found = [
        {"class_id": 1, "label": label, "score": 0.9,
         "box": {"x_min": x0, "y_min": y0, "x_max": x1, "y_max": y1}}
        for label, (x0, y0, x1, y1) in zip(("car", "truck"), boxes, strict=True)
    ]  # fmt: skip
    first = {"detections": found, "model": {"name": "detector", "version": "1"},
             "image_width": 640, "image_height": 480}  # fmt: skip
    return {"pipeline": "p", "detections": first, "instances": instances, "steps": steps,
            "image_width": 640, "image_height": 480}  # fmt: skip


def test_the_captions_say_a_failed_crop_s_code_a_vector_s_size_and_how_many_were_found(
    browser: str, tmp_path: Path
) -> None:
    vector = {"embedding": {"embedding": [0.25] * 16, "dimension": 16, "normalized": True}}
    parts = [{"label": "plate", "score": 0.91, "box": {}}, {"label": "wheel", "score": 0.8,
              "box": {}}, {"label": "wheel", "score": 0.7, "box": {}}]  # fmt: skip
    failed = {"code": 14, "message": "TF Serving at x is unavailable"}
    instances = [
        {"id": 0, "steps": {"colour": {"parent": 0, "step": "colour", "error": failed},
                            "vector": {"parent": 0, "step": "vector", **vector}}},
        {"id": 1, "steps": {"colour": {"parent": 1, "step": "colour", "classes": {"classes": []}},
                            "parts": {"parent": 1, "step": "parts",
                                      "detections": {"detections": parts}}}},
    ]  # fmt: skip
    steps = [
        {"name": "colour", "model": {"name": "c", "version": "2"}, "crops": 2, "failed": 1},
        {"name": "vector", "model": {"name": "e", "version": "1"}, "crops": 1,
         "skipped": [{"reason": "label", "count": 1, "ids": [1]}]},
        {"name": "parts", "crops": 1, "skipped": [{"reason": "min_size", "count": 1, "ids": [0]}]},
    ]  # fmt: skip
    html = tmp_path / "page.html"
    html.write_text(page_html.render(default_registry("detector", default_task="detection"),
                                     BUILT_IN))  # fmt: skip
    grey = scenes.encode(np.full((480, 640, 3), 128, np.uint8), "PNG")

    async def work(page: Page) -> Shown:
        return await show_result(page, html.as_uri(), None, answer(steps, instances), grey)

    shown = asyncio.run(with_page(browser, work))
    assert shown.state == "done", shown.status
    assert shown.rows[2:] == [
        "#0 car: colour: UNAVAILABLE, vector: 16 values",
        "#1 truck: colour: none, parts: plate 0.91 +2",
    ]
    assert shown.status == (
        "Pipeline p: 2 detections by detector version 1; colour: 2 crops by c version 2, 1 "
        "failed; vector: 1 crops by e version 1, 1 skipped (label); parts: 1 crops, 1 skipped "
        "(min_size)"
    )
    # The client's --draw captions the same answer alike (its errors by code name, as its
    # JSON lines write them).
    order = [step["name"] for step in steps]
    instances[0]["steps"]["colour"]["error"] = {"code": "UNAVAILABLE", "message": "..."}
    assert [", ".join(captions(i["steps"], order)) for i in instances] == [
        row.partition(": ")[2] for row in shown.rows[2:]
    ]
    # Two captions under the car's label (above its box), in its colour (the first).
    car = shown.pixels[60 + 1 : 60 + 2 * LINE - 2, 41:60]
    assert (np.abs(car - (255, 0, 255)).sum(axis=-1) < 30).mean() > 0.4
