"""A headless Debian chromium driven over the DevTools protocol, for tests of the HTTP door's
page: the `browser` fixture (module scope; skipped, saying why, when chromium is not
installed: `make pytest` installs it as root), one tab per `with_page` call, the `Page`
calls the tests need, and `show_result`: the page drawing a given result over a given image,
its canvas read back; `run_page`: the gateway's page run on an image, read back the same way
(`read`: what the page shows now, e.g. after `Page.pick_file`); `job_view`: a batch job run
from the page's jobs view.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from PIL import Image

from tests.support import tools

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
    binary = tools.binary("chromium", "apt-get install -y chromium (make pytest does it as root)")
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
        """The value of `expression`, awaited when it is a promise; AssertionError with the
        message when it throws."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def open(self, url: str) -> None:
        """Navigates and waits for the page to be ready (its state `idle`)."""
        await self.send("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while await self.evaluate("document.body ? document.body.dataset.state : ''") != "idle":
            assert time.monotonic() < deadline, "the page did not load"
            await asyncio.sleep(0.05)

    async def set_files(self, selector: str, paths: list[Path]) -> None:
        """Picks `paths` in the file input at `selector`, as a person would. The input is
        named by a JavaScript object, not a DOM node id: node ids from DOM.getDocument lapse
        when the document updates after it loaded, which failed the page's pipeline test
        once in CI ("Could not find node with given id")."""
        found = await self.send(
            "Runtime.evaluate", expression=f"document.querySelector({selector!r})"
        )
        assert "exceptionDetails" not in found, found["exceptionDetails"]
        element = found["result"]
        assert element.get("subtype") == "node", f"no {selector} on the page: {element}"
        await self.send(
            "DOM.setFileInputFiles", files=[str(p) for p in paths], objectId=element["objectId"]
        )

    async def pick_file(self, url: str, path: Path) -> str:
        """Opens the page and picks `path` in its file input, as a person would."""
        await self.open(url)
        await self.set_files("#file", [path])
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


@dataclass(frozen=True)
class Shown:
    """The page after drawing one result: its state (`done`, `error`), status line, text rows,
    raw JSON, and the canvas read back as (height, width, 3) ints."""

    state: str
    status: str
    rows: list[str]
    raw: str
    pixels: np.ndarray


_READ = """({state: document.body.dataset.state, status: $("status").textContent,
  raw: $("raw").textContent,
  rows: [...document.querySelectorAll("#rows li")].map((li) => li.textContent),
  png: $("canvas").toDataURL("image/png")})"""
_SHOW = """(async () => {
  const blob = await (await fetch(%s)).blob();
  document.body.dataset.state = "done";
  try { await %s; }
  catch (error) {
    status(String(error.message || error), true);
    document.body.dataset.state = "error";
  }
  return %s;
})()"""


def _shown(read: dict[str, Any]) -> Shown:
    data = base64.b64decode(read["png"].partition(",")[2])
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    return Shown(read["state"], read["status"], read["rows"], read["raw"], pixels)


async def show_result(
    page: Page, url: str, verb: str | None, result: Any, image: bytes, mime: str = "image/png"
) -> Shown:
    """Opens the page at `url` and has it draw `result` of the task route `verb` over `image`,
    as it does with an answer of the gateway (the page's `show`), then reads the canvas
    back. verb=None: `result` is a pipeline's answer (the page's `showPipeline`)."""
    await page.open(url)
    data = json.dumps(f"data:{mime};base64," + base64.b64encode(image).decode())
    answer = json.dumps(result)
    call = f"show({json.dumps(verb)}, {answer}, blob)" if verb else f"showPipeline({answer}, blob)"
    return _shown(await page.evaluate(_SHOW % (data, call, _READ)))


async def run_page(
    page: Page,
    gateway_url: str,
    model: str,
    image: bytes,
    mime: str,
    picker: str = "model",
    **options: str,
) -> Shown:
    """The gateway's page run on `image` with `model` and the task's `options` filled in
    (`/?model=...&image=data:...&top_k=...`; picker="pipeline": `model` is a pipeline's
    name, `/?pipeline=...`), as a person would see it once it is done (or failed)."""
    data = f"data:{mime};base64,{base64.b64encode(image).decode()}"
    query = urllib.parse.urlencode({picker: model, "image": data, **options})
    await page.run(f"{gateway_url}/?{query}")
    return await read(page)


async def read(page: Page) -> Shown:
    """What the page shows now: its state, status line, rows, JSON and canvas."""
    return _shown(await page.evaluate(_READ))


async def with_page(address: str, work: Any) -> Any:
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


async def job_view(page: Page, url: str, files: list[Path], uri: str) -> dict[str, Any]:
    """Opens the page at `url`, picks `files` or types `uri` in its jobs view, presses Start
    and waits for the view to settle; returns what it shows (and the results link's
    download)."""
    await page.open(url)
    if files:
        await page.set_files("#job-files", files)
    else:
        await page.evaluate(f"document.getElementById('job-uri').value = {json.dumps(uri)}")
    await page.evaluate("document.getElementById('job-start').click()")
    deadline = time.monotonic() + 120
    while (state := await page.evaluate("document.body.dataset.job || ''")) not in (
        "done",
        "error",
    ):
        assert time.monotonic() < deadline, f"the job view stayed {state!r}"
        await asyncio.sleep(0.1)
    answer = await page.send(
        "Runtime.evaluate",
        returnByValue=True,
        awaitPromise=True,
        expression=(
            "(async () => { const link = document.getElementById('job-results');"
            " const progress = document.getElementById('job-progress');"
            " return {state: document.body.dataset.job,"
            " status: document.getElementById('job-status').textContent,"
            " value: progress.value, max: progress.max, hidden: link.hidden,"
            " download: link.download, href: link.getAttribute('href'),"
            " results: link.hidden ? '' : await (await fetch(link.href)).text()}; })()"
        ),
    )
    return dict(answer["result"]["value"])
