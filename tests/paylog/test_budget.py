"""The payload log's budget counts the whole record (issue 42.5): what a queued record keeps
alive (its answer, ids, image) never passes GATEWAY_PAYLOAD_LOG_QUEUE_BYTES, the reservation
is taken before the record is made, and an attribute too long for a header goes in the body
instead of making an HTTP collector refuse the event."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.domain import ModelRef, Outcome, Request
from gateway.paylog import sinks
from gateway.paylog.writer import PayloadLog, held
from gateway.tasks.builtin import BUILT_IN
from gateway.tasks.detection.nouns import Box
from gateway.tasks.segmentation.nouns import Instance, Mask, SegmentOptions, Segments
from tests.support.payloads import count, offer

TASK = BUILT_IN.for_verb("segment").task


def segmentation(log: PayloadLog, request_id: str, instances: int, rle: int) -> None:
    """One segmentation answer of `instances` whole-image masks of `rle` RLE characters each,
    offered as the pipeline does; the caller's references are gone when this returns."""
    masks = [
        Instance(1, "thing", 0.9, Box(0, 0, 4000, 3000),
                 Mask(3000, 4000, counts=os.urandom(rle // 2).hex()))
        for _ in range(instances)
    ]  # fmt: skip
    model = ModelRef("masks", 1)
    request = Request(b"\x89PNG" + bytes(40_000), model, SegmentOptions(), request_id,
                      None, "Segment", (), "anonymous")  # fmt: skip
    outcome = Outcome(Segments(masks), 4000, 3000, "masks", 1, request_id, {})
    log(TASK, request, request_id, model, outcome, None, 1.0)


def test_what_queued_records_hold_never_passes_the_budget(tmp_path: Path) -> None:
    """A sink that never reads (a FIFO without a reader: the writer is stuck opening it),
    answers of about 1 MB each: the memory the queue keeps alive is within what it reserved,
    and that within the budget; records past it are dropped, not kept."""
    fifo = tmp_path / "payloads.fifo"
    os.mkfifo(fifo)
    budget = 8 << 20
    log = PayloadLog(sinks.FileSink(str(fifo), 1 << 30), BUILT_IN, budget)
    log.start()
    dropped, queued = count("dropped"), count("queued")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(24):
            segmentation(log, f"s{i:02d}", instances=100, rle=10_000)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    took = count("queued") - queued
    assert 1 <= took < 24 and count("dropped") - dropped == 24 - took
    assert kept > 900_000 * took  # the answers are really held ...
    assert kept <= log.reserved <= budget  # ... and every byte of them is reserved
    with open(fifo, "rb") as reader:  # a reader comes: everything queued is written
        lines = b""
        while lines.count(b"\n") < took:
            chunk = reader.read1(1 << 20)
            assert chunk
            lines += chunk
        log.close()
    assert log.reserved == 0
    first = json.loads(lines.splitlines()[0])
    assert len(first["data"]["response"]["result"]["instances"]) == 100


def test_held_counts_strings_arrays_and_lists_of_numbers_without_walking_them() -> None:
    polygon = [float(n) for n in range(100_000)]
    assert held(polygon) >= 100_000 * 40
    assert held("x" * 1000) >= 1000 and held(b"y" * 1000) >= 1000
    assert held({"a": [polygon, "z" * 500]}) > held(polygon) + 500
    # A named tuple that starts and ends with numbers or None is walked, not taken for a
    # list of numbers: its polygons count.
    mask = Mask(3000, 4000, polygons=[polygon, polygon])
    assert held(mask) >= 2 * held(polygon)


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """An aiohttp collector with aiohttp's own header limit (8,190 bytes a field): a header
    over it is refused (400), as KServe's and Knative's Go servers refuse theirs."""
    received: list[tuple[dict[str, str], bytes]] = []
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        received.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        return web.Response(status=202)

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{port[0]}/", received
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_a_long_request_id_goes_in_the_body_and_the_collector_takes_the_event(
    collector: tuple[str, list[tuple[dict[str, str], bytes]]],
) -> None:
    """A 9,000-character id once became a ce-requestid header the collector refused: the
    event was dropped (audit evasion). Now the attribute is left out, the id is in the body."""
    url, received = collector
    log = PayloadLog(sinks.HttpSink(url, timeout=5), BUILT_IN, 1 << 20)
    log.start()
    failed, written = count("failed"), count("written")
    long_id = "i" * 9000
    offer(log, request_id=long_id)
    offer(log, request_id="short")
    log.close()
    assert (count("written") - written, count("failed") - failed) == (2, 0)
    (long_headers, long_body), (short_headers, _) = received
    assert "ce-requestid" not in long_headers and short_headers["ce-requestid"] == "short"
    assert all(len(v) <= 256 for v in long_headers.values())
    data = json.loads(long_body)
    assert data["request"]["request_id"] == long_id
    assert data["omitted_attributes"] == ["requestid"]
