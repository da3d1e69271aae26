"""Hostile HTTP bodies through the real door: each is refused with a 4xx in the door's error
format, costs the gateway little work, never logs a traceback, and /ping keeps answering
while it is decoded.

One gateway (default limits, the HTTP door on) in front of the local TF Serving. Every body
is sent whole with http.client, as an attacker would. How each claim is measured so that a
loaded 2-core machine cannot make it flake:
- "answered within 1 s": the gateway process's CPU time (utime + stime from /proc) for the
  request, which waiting for a core does not inflate, is under 1 s;
- "off the event loop": the CPU time of the gateway's main thread, where its event loop
  runs, grows by far less than the decoding costs (the decoding ran in another thread);
- "/ping keeps answering within 250 ms": /ping is called back to back on a kept-alive
  connection during the request; while each call waits, the gateway's CPU time grows by at
  most 250 ms. On an idle machine that is the call's own latency; on a loaded one, time spent
  waiting for a core does not count, time spent behind the hostile body's work does.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest

from gateway.config import Settings
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

DETECT = "/v1/models/detector:detect"
DEFAULTS = Settings()
JSON_LIMIT = DEFAULTS.http_max_body_bytes  # JSON carries the image as base64
BODY_LIMIT = DEFAULTS.server_max_receive_bytes  # MessagePack, multipart, raw images
PING_MARGIN = 0.25
CPU_BUDGET = 1.0
TICKS = os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def gateway(tfs: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with run_gateway(
        tfs.target, log_dir=tmp_path_factory.mktemp("hostile-bodies"), http=True
    ) as gw:
        yield gw


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU time (user + system) of a process, or of one of its threads."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Ping:
    start: float
    end: float
    loop_cpu: float  # what the gateway's event-loop thread used while this call waited

    @property
    def wall(self) -> float:
        return self.end - self.start


class Pinger:
    """Calls GET /ping back to back on one kept-alive connection; records each call and the
    CPU time of the gateway's event-loop thread (the one that answers /ping) meanwhile, and the
    statuses (200, or 503 while TF Serving's health
    check lags on a loaded machine: an answer all the same)."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.pid = gw.process.pid
        self.connection = http.client.HTTPConnection("127.0.0.1", gw.http_port, timeout=60)
        self.calls: list[Ping] = []
        self.statuses: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            cpu, started = cpu_seconds(self.pid, self.pid), time.perf_counter()
            self.connection.request("GET", "/ping")
            response = self.connection.getresponse()
            response.read()
            ended = time.perf_counter()
            self.calls.append(Ping(started, ended, cpu_seconds(self.pid, self.pid) - cpu))
            self.statuses.add(response.status)

    def wait_for_calls_ending_after(self, moment: float, count: int = 1) -> None:
        while sum(call.end > moment for call in self.calls) < count:
            time.sleep(0.005)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.connection.close()


@dataclass
class Answer:
    status: int
    error: dict[str, str]
    wall: float
    cpu: float  # the gateway's, for the whole exchange
    loop_cpu: float  # its main (event loop) thread's
    pings: list[Ping]  # the /ping calls in flight at any time during the exchange


def send(gw: GatewayProcess, body: bytes, content_type: str, ping: bool = True) -> Answer:
    """POSTs `body` whole while /ping is called in a loop (unless `ping` is False: the event
    loop's CPU time is then the request's alone); the answer and what it cost."""
    pid = gw.process.pid
    pinger = Pinger(gw)
    with pinger if ping else contextlib.nullcontext(pinger):
        if ping:
            pinger.wait_for_calls_ending_after(time.perf_counter(), count=3)
        connection = http.client.HTTPConnection("127.0.0.1", gw.http_port, timeout=120)
        cpu, loop_cpu = cpu_seconds(pid), cpu_seconds(pid, pid)
        started = time.perf_counter()
        connection.request("POST", DETECT, body, {"Content-Type": content_type})
        response = connection.getresponse()
        raw = response.read()
        ended = time.perf_counter()
        cpu, loop_cpu = cpu_seconds(pid) - cpu, cpu_seconds(pid, pid) - loop_cpu
        connection.close()
        if ping:
            pinger.wait_for_calls_ending_after(ended)  # the /ping in flight when the answer came
    assert pinger.statuses <= {200, 503}, pinger.statuses
    media_type = response.getheader("Content-Type", "").split(";")[0]
    # The door's error format, in the request's own format.
    if content_type == "application/x-msgpack":
        assert media_type == "application/x-msgpack"
        error = msgpack.unpackb(raw)["error"]
    else:
        assert media_type == "application/json"
        error = json.loads(raw)["error"]
    assert set(error) == {"code", "message"}
    during = [call for call in pinger.calls if call.end > started and call.start < ended]
    return Answer(response.status, error, ended - started, cpu, loop_cpu, during)


def assert_cheap(answer: Answer) -> None:
    """The request cost under a second of the gateway's CPU (all its threads), and no /ping
    waited behind more than 250 ms of work on the event loop: on an idle machine, no /ping took
    over 250 ms. CPU, not wall time, so a loaded machine does not move it; the loop thread's
    alone, because work in other threads (decoding, outside the GIL) runs beside the loop
    instead of in front of the /ping, and a slower machine stretches a /ping over more of it."""
    assert answer.cpu < CPU_BUDGET, answer
    # A refusal answered within a millisecond or two may overlap no /ping (the pinger is
    # between two calls): then the loop's CPU over the whole exchange bounds what any /ping
    # could have waited behind.
    waited = max((call.loop_cpu for call in answer.pings), default=answer.loop_cpu)
    assert waited <= PING_MARGIN, answer


@pytest.fixture
def log_mark(gateway: GatewayProcess) -> Iterator[None]:
    """After the test: nothing the gateway logged meanwhile is a traceback or an error."""
    start = gateway.log_path.stat().st_size
    yield
    with gateway.log_path.open("rb") as log:
        log.seek(start)
        text = log.read().decode()
    assert "Traceback" not in text and '"level":"ERROR"' not in text, text[-3000:]


# --- the three bodies ---------------------------------------------------------------


def test_json_nested_100000_deep_is_400_not_500(gateway: GatewayProcess, log_mark: None) -> None:
    body = b'{"image": "", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = send(gateway, body, "application/json")
    assert (answer.status, answer.error["code"]) == (400, "INVALID_ARGUMENT")
    assert "nests containers more than 32 deep" in answer.error["message"]
    assert_cheap(answer)


def test_msgpack_with_2000000_metadata_keys_is_refused_from_its_header(
    gateway: GatewayProcess, log_mark: None
) -> None:
    packer = msgpack.Packer()
    keys = 2_000_000
    body = b"".join(
        [packer.pack_map_header(keys + 1), packer.pack("image"), packer.pack(b"x")]
        + [packer.pack(i) + b"\xc0" for i in range(keys)]
    )
    answer = send(gateway, body, "application/x-msgpack")
    assert (answer.status, answer.error["code"]) == (413, "INVALID_ARGUMENT")
    assert "2000001 entries" in answer.error["message"]
    assert "GATEWAY_HTTP_MAX_METADATA_KEYS" in answer.error["message"]
    assert_cheap(answer)


def test_multipart_with_40000_parts_is_refused_at_the_17th(
    gateway: GatewayProcess, log_mark: None
) -> None:
    parts = b"".join(
        b'--B\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % i for i in range(40_000)
    )
    body = b'--B\r\nContent-Disposition: form-data; name="image"\r\n\r\nxx\r\n' + parts + b"--B--"
    answer = send(gateway, body, "multipart/form-data; boundary=B")
    assert (answer.status, answer.error["code"]) == (413, "INVALID_ARGUMENT")
    assert "more than 16 parts" in answer.error["message"]
    assert_cheap(answer)


# --- bodies at the size limit -----------------------------------------------------------------


def _fill(head: bytes, unit: bytes, tail: bytes, limit: int) -> bytes:
    """head + unit repeated + tail, as long as fits in `limit` bytes."""
    return head + unit * ((limit - len(head) - len(tail)) // len(unit)) + tail


def _msgpack_array_image() -> bytes:
    """{"image": [nil, nil, ...]}: an array header announcing as many items as follow."""
    count = BODY_LIMIT - 12
    return b"\x81\xa5image\xdd" + count.to_bytes(4, "big") + b"\xc0" * count


def _msgpack_small_keys() -> bytes:
    """A map32 of {1: nil} entries (2 bytes each) filling the limit."""
    count = (BODY_LIMIT - 5) // 2
    return b"\xdf" + count.to_bytes(4, "big") + b"\x01\xc0" * count


FIELD = b"--B\r\nContent-Disposition: form-data; name=f\r\n\r\nv\r\n"


AT_THE_LIMIT: dict[str, tuple[str, Callable[[], bytes], int, str]] = {
    "json nested": (
        "application/json",
        lambda: _fill(b'{"image": "", "x": ', b"[", b"", JSON_LIMIT),
        400,
        "more than 32 deep",
    ),
    "json wide": (
        "application/json",
        lambda: _fill(b'{"image": "", "x": [', b"[],", b"[]]}", JSON_LIMIT),
        413,
        "more than 10000 tokens",
    ),
    "json escapes": (
        "application/json",
        lambda: _fill(b'{"image": "', b'\\"', b"", JSON_LIMIT),
        413,
        "more than 10000 escaped characters",
    ),
    "json options": (
        "application/json",
        lambda: _fill(b'{"image": "AAAA", "request_id": "', b"x", b'"}', JSON_LIMIT),
        413,
        "GATEWAY_HTTP_MAX_METADATA_BYTES",
    ),
    "json bad base64": (
        "application/json",
        lambda: _fill(b'{"image": "', b"AAAA", b'!!!!"}', JSON_LIMIT),
        400,
        "image is not valid base64",
    ),
    "msgpack metadata value": (
        "application/x-msgpack",
        lambda: msgpack.packb({"image": b"x", "meta": bytes(BODY_LIMIT - 32)}),
        413,
        "GATEWAY_HTTP_MAX_METADATA_BYTES",
    ),
    "msgpack image as an array": (
        "application/x-msgpack",
        _msgpack_array_image,
        400,
        "image must be bin (bytes), got an array",
    ),
    "msgpack small keys": (
        "application/x-msgpack",
        _msgpack_small_keys,
        413,
        "metadata keys",
    ),
    "multipart tiny parts": (
        "multipart/form-data; boundary=B",
        lambda: _fill(b"", FIELD, b"--B--", BODY_LIMIT),
        413,
        "more than 16 parts",
    ),
    "multipart one header": (
        "multipart/form-data; boundary=B",
        lambda: _fill(b"--B\r\nX-Pad: ", b"a", b"\r\n\r\nv\r\n--B--", BODY_LIMIT),
        413,
        "headers are longer than 8192 bytes",
    ),
    "multipart image of newlines": (
        "multipart/form-data; boundary=B",
        lambda: _fill(
            b'--B\r\nContent-Disposition: form-data; name="image"\r\n\r\n',
            b"\n",
            b"\r\n--B--",
            BODY_LIMIT,
        ),
        413,
        "GATEWAY_MAX_IMAGE_BYTES",
    ),
}


@pytest.mark.parametrize("name", list(AT_THE_LIMIT))
def test_a_hostile_body_at_the_size_limit_is_refused_cheaply(
    gateway: GatewayProcess, log_mark: None, name: str
) -> None:
    content_type, build, status, named = AT_THE_LIMIT[name]
    body = build()
    limit = JSON_LIMIT if content_type == "application/json" else BODY_LIMIT
    assert limit - 64 <= len(body) <= limit, (len(body), limit)
    answer = send(gateway, body, content_type)
    assert answer.status == status and named in answer.error["message"], answer.error
    assert_cheap(answer)


def test_decoding_a_large_body_runs_off_the_event_loop(
    gateway: GatewayProcess, log_mark: None
) -> None:
    """A JSON body at the limit whose decoding is the most work a body can ask for (a valid
    string of base64, decoded until its last bytes): the main thread, where the event loop
    runs, does a small part of the work. Sent without /ping calls: the loop answers those
    back to back meanwhile, and their CPU time, which grows with the wall time the decoding
    takes on a loaded machine, is no part of this body's work (with them the loop's share
    reached 0.18 s of 0.32 s at load 4)."""
    content_type, build, _, _ = AT_THE_LIMIT["json bad base64"]
    answer = send(gateway, build(), content_type, ping=False)
    assert answer.status == 400
    assert answer.loop_cpu < answer.cpu / 2, answer
