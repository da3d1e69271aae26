"""The payload log's queue and sinks: sampling per caller, the byte budget when a sink stalls
(a FIFO nobody reads, an HTTP sink that never answers), file rotation, objects through fsspec,
binary-mode POSTs, and bad settings refused naming the setting."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest

from gateway.config import Settings
from gateway.paylog import sinks
from gateway.paylog.sampling import FULL, PaylogError, Policy, Sampling
from gateway.paylog.writer import PayloadLog
from gateway.tasks.builtin import BUILT_IN
from tests.support.payloads import count, offer, record_cost

A, B, C = "uri:spiffe://test/sa/a", "uri:spiffe://test/sa/b", "cn:c"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def test_each_caller_is_sampled_at_its_own_rate(tmp_path: Path) -> None:
    path = tmp_path / "payloads.jsonl"
    policy = Policy(Sampling(0.5), exact={A: Sampling(1.0), B: Sampling(0.0)})
    log = PayloadLog(sinks.FileSink(str(path), 1 << 30), BUILT_IN, 64 << 20, policy)
    log.start()
    random.seed(35)
    for i in range(1000):
        for caller in (A, B, C):
            offer(log, caller=caller, request_id=f"{caller}-{i}")
    offer(log, caller="", request_id="internal")  # the gateway's own batch work: never
    log.close()
    logged = Counter(event["caller"] for event in lines(path))
    assert logged[A] == 1000 and logged[B] == 0 and "" not in logged
    assert 400 <= logged[C] <= 600  # binomial(1000, 0.5): 6 standard deviations either way


def test_a_sink_that_never_reads_costs_no_request_and_drops_are_counted(tmp_path: Path) -> None:
    fifo = tmp_path / "payloads.fifo"
    os.mkfifo(fifo)
    budget = 1 << 20
    image = b"\x00" * 100_000
    log = PayloadLog(sinks.FileSink(str(fifo), 1 << 30), BUILT_IN, budget)
    log.start()
    dropped, queued = count("dropped"), count("queued")
    for i in range(100):  # the writer is stuck opening the FIFO: nothing waits for it
        offer(log, image=image, request_id=f"r{i:02d}")
    each = record_cost(image, "r00")
    fits = budget // each
    assert log.reserved == fits * each <= budget
    assert count("queued") - queued == fits
    assert count("dropped") - dropped == 100 - fits
    written = count("written")
    with open(fifo, "rb") as reader:  # a reader comes: the queue drains
        got = b""
        while got.count(b"\n") < fits:
            chunk = reader.read1(65536)
            assert chunk, "the FIFO closed before the queued records came"
            got += chunk
        wait_for(lambda: count("written") - written == fits, "the records written")
        log.close()
    assert [json.loads(x)["requestid"] for x in got.splitlines()] == [
        f"r{i:02d}" for i in range(fits)
    ]
    assert log.reserved == 0


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An HTTP sink that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/events"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def test_an_http_sink_that_never_answers_fails_each_post_once_and_drops(silent_server: str) -> None:
    image = b"\x01" * 300_000
    log = PayloadLog(sinks.HttpSink(silent_server, timeout=0.2), BUILT_IN, 1 << 20)
    log.start()
    failed, dropped, queued = count("failed"), count("dropped"), count("queued")
    for i in range(20):
        offer(log, image=image, request_id=f"r{i:02d}")
    took = int(count("queued") - queued)
    assert took == (1 << 20) // record_cost(image, "r00")
    assert count("dropped") - dropped == 20 - took
    wait_for(lambda: count("failed") - failed == took, "each queued POST to time out")
    assert log.reserved == 0
    log.close()


class Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        Collector.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(202)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_an_http_sink_gets_one_binary_mode_post_per_event() -> None:
    Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        log = PayloadLog(sinks.HttpSink(url, timeout=5), BUILT_IN, 1 << 20)
        log.start()
        written = count("written")
        offer(log, caller=A, request_id="one")
        offer(log, caller=A, request_id="two")
        log.close()
        assert count("written") - written == 2
    finally:
        server.shutdown()
        server.server_close()
    assert [h["ce-requestid"] for h, _ in Collector.received] == ["one", "two"]
    headers, body = Collector.received[0]
    assert headers["content-type"] == "application/json"
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-type"] == "detection.gateway.inference.v1"
    assert headers["ce-caller"] == A and headers["ce-modelversion"] == "2"
    assert {"ce-id", "ce-source", "ce-time", "ce-task", "ce-model", "ce-code"} <= set(headers)
    assert json.loads(body)["request"]["request_id"] == "one"


def test_a_file_is_rotated_at_its_size_and_nothing_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "payloads.jsonl"
    log = PayloadLog(
        sinks.FileSink(str(path), 1 << 20), BUILT_IN, 8 << 20, Policy(Sampling(1.0, FULL))
    )
    log.start()
    for i in range(12):  # ~270 KB per line: a rotation every 4 lines
        offer(log, image=os.urandom(200_000), request_id=f"r{i}")
    log.close()
    files = sorted(tmp_path.iterdir())
    rotated = [f for f in files if f != path]
    assert len(rotated) >= 2
    assert all(f.name.startswith("payloads.") and f.suffix == ".jsonl" for f in rotated)
    ids = [event["requestid"] for f in [*rotated, path] if f.exists() for event in lines(f)]
    assert ids == [f"r{i}" for i in range(12)]


def test_objects_are_written_whole_in_chunks_through_fsspec() -> None:
    fs = fsspec.filesystem("memory")
    prefix = f"/paylog-{random.getrandbits(32)}"
    sink = sinks.open_sink(f"memory://{prefix}", 1 << 20, 5)
    assert isinstance(sink, sinks.ObjectSink)
    log = PayloadLog(sink, BUILT_IN, 8 << 20, Policy(Sampling(1.0, FULL)))
    log.start()
    for i in range(10):
        offer(log, image=os.urandom(200_000), request_id=f"r{i}")
    log.close()
    objects = sorted(fs.find(prefix))
    assert len(objects) >= 2 and all(o.endswith(".jsonl") for o in objects)
    ids = [json.loads(x)["requestid"] for o in objects for x in fs.cat_file(o).splitlines()]
    assert ids == [f"r{i}" for i in range(10)]
    fs.rm(prefix, recursive=True)


def test_one_file_per_worker_when_workers_share_the_gateway(tmp_path: Path) -> None:
    environ = {"GATEWAY_WORKER_COUNT": "2", "GATEWAY_WORKER_INDEX": "1"}
    sink = sinks.open_sink(str(tmp_path / "payloads.jsonl"), 1 << 20, 5, environ)
    assert isinstance(sink, sinks.FileSink)
    assert sink.path == str(tmp_path / "payloads.w1.jsonl")


@pytest.mark.parametrize(
    ("target", "named"),
    [
        ("http://", "the URL has no host"),
        ("nosuchscheme://bucket/x", "cannot be opened"),
        ("/no/such/directory/payloads.jsonl", "directory /no/such/directory not found"),
    ],
)
def test_a_sink_that_cannot_be_is_refused_naming_the_setting(target: str, named: str) -> None:
    with pytest.raises(PaylogError, match=f"GATEWAY_PAYLOAD_LOG=.*{named}"):
        sinks.open_sink(target, 1 << 20, 5)


def test_a_directory_is_not_a_log_file(tmp_path: Path) -> None:
    with pytest.raises(PaylogError, match="is a directory"):
        sinks.open_sink(str(tmp_path), 1 << 20, 5)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"payload_log": "/tmp/x.jsonl", "payload_log_queue_bytes": 1000}, "queue-bytes"),
        ({"payload_log": "/tmp/x.jsonl", "payload_log_rotate_bytes": 0}, "rotate-bytes"),
        ({"payload_log": "/tmp/x.jsonl", "payload_log_timeout": 0}, "payload-log-timeout"),
        ({"payload_log_config": "paylog.toml"}, "payload-log-config is set but payload-log"),
    ],
)
def test_bad_numbers_are_refused_naming_the_setting(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Settings(**settings).validate()
