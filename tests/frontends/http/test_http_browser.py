"""GET / in a real headless browser (Debian's chromium), driven over the DevTools protocol.

The page loads a sample image (a data: URL in `?image=`), posts it to the gateway, and draws
the detections; the test screenshots the canvas and finds the box colour along every edge
the JSON names, and nowhere far from the boxes. Skipped, saying why, only when chromium is
not installed (`make pytest` installs it when run as root).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from PIL import Image

from gateway.frontends.http.page import BOX_COLOUR
from serving import scenes
from tests.support.gatewayproc import GatewayProcess

BOX_RGB = np.array([int(BOX_COLOUR[i : i + 2], 16) for i in (1, 3, 5)])
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1200,1000",
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running headless chromium; yields its DevTools HTTP address."""
    binary = shutil.which("chromium")
    if binary is None:
        pytest.skip(
            "chromium is not installed: apt-get install -y chromium (make pytest does it as root)"
        )
    profile = tmp_path_factory.mktemp("chromium-profile")
    log = (profile.parent / "chromium.log").open("wb")
    process = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"], stdout=log, stderr=log
    )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.exists() and active.read_text().count("\n") >= 1):
            assert process.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        yield f"127.0.0.1:{active.read_text().split()[0]}"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


class Page:
    """One browser tab over the DevTools protocol (JSON messages on a websocket)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._id = 0

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self._ws.send_json({"id": self._id, "method": method, "params": params})
        while True:
            message = await self._ws.receive_json(timeout=60)
            if message.get("id") == self._id:
                assert "error" not in message, message
                return dict(message["result"])

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def pick_file(self, url: str, path: Path) -> str:
        """Opens the page and picks `path` in its file input, as a person would."""
        await self.send("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while await self.evaluate("document.body ? document.body.dataset.state : ''") != "idle":
            assert time.monotonic() < deadline, "the page did not load"
            await asyncio.sleep(0.05)
        document = await self.send("DOM.getDocument")
        node = await self.send(
            "DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#file"
        )
        await self.send("DOM.setFileInputFiles", files=[str(path)], nodeId=node["nodeId"])
        return await self.wait()

    async def run(self, url: str) -> str:
        """Navigates and waits for the page's state to settle on done or error."""
        await self.send("Page.navigate", url=url)
        return await self.wait()

    async def wait(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = await self.evaluate("document.body ? document.body.dataset.state : ''")
            if state in ("done", "error"):
                return str(state)
            if time.monotonic() > deadline:
                where = await self.evaluate("document.URL.slice(0, 200) + ' ' + document.title")
                raise AssertionError(f"page state stayed {state!r} at {where}")
            await asyncio.sleep(0.1)


async def _with_page(address: str, work: Any) -> Any:
    async with aiohttp.ClientSession() as session:
        async with session.put(f"http://{address}/json/new?about:blank") as response:
            target = await response.json()
        try:
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=1200,
                    height=1000,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                return await work(page)
        finally:
            async with session.get(f"http://{address}/json/close/{target['id']}"):
                pass


def page_url(gateway: GatewayProcess, image: bytes, mime: str, model: str) -> str:
    data = f"data:{mime};base64,{base64.b64encode(image).decode()}"
    return f"{gateway.http_url}/?" + urllib.parse.urlencode({"model": model, "image": data})


async def _canvas_screenshot(page: Page) -> tuple[np.ndarray, dict[str, Any]]:
    info = await page.evaluate(
        "(() => { const c = document.getElementById('canvas'); const r = c.getBoundingClientRect();"
        " return {x: r.left + c.clientLeft, y: r.top + c.clientTop, width: c.width,"
        " height: c.height, cssWidth: c.clientWidth,"
        " raw: document.getElementById('raw').textContent,"
        " classes: [...document.querySelectorAll('#classes li')].map(li => li.textContent),"
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

    state, pixels, info = asyncio.run(_with_page(browser, work))
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

    state, shot, info = asyncio.run(_with_page(browser, work))
    assert state == "done", info["status"]
    assert info["classes"][:2] == ["blue 0.800", "red 0.200"]
    assert json.loads(info["raw"])["classes"][0]["label"] == "blue"
    assert is_box(shot[:10, :10]).any()  # the top class's label drawn in the corner


def test_page_shows_the_gateway_s_error(http_gateway, browser) -> None:
    async def work(page: Page) -> tuple[str, str]:
        state = await page.run(page_url(http_gateway, b"not an image", "image/png", "detector"))
        return state, await page.evaluate("document.getElementById('status').textContent")

    state, status = asyncio.run(_with_page(browser, work))
    assert state == "error"
    assert status.startswith("INVALID_ARGUMENT: image data could not be decoded"), status
