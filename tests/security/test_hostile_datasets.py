"""Batch work cannot take online serving down (issue 33 item 1), tried as an attacker would
through the real HTTP door of a gateway process with the default `local` executor: hostile
dataset files, uploaded or in an allowed directory, each end as a clear error of the job,
while `/ping` and a Detect call answer throughout, the gateway process is never restarted
(same pid, alive) and its peak RSS stays within a sanity bound (not a benchmark).

Rows of the attack table in docs/security.md, each proved by the test named after it:
- a 65 KB gzip manifest inflating to 64 MiB of `0`, uploaded: the line is skipped unread
  past the line limit, the job's result names GATEWAY_MAX_IMAGE_BYTES;
- a `.tfrecord.gz` whose record announces 2^40 bytes (with a valid length checksum): that
  record is a DATA_LOSS line naming the limit, nothing allocated for it;
- a 3 GiB input object (sparse) among images: that line's error from its listed size,
  never read;
- 32 MiB of newlines as a manifest: the job fails RESOURCE_EXHAUSTED naming
  GATEWAY_BATCH_MAX_ITEMS_PER_JOB before one line is written;
- a gzip bomb past GATEWAY_BATCH_MAX_DECOMPRESSED_BYTES: the job fails naming it.
"""

from __future__ import annotations

import gzip
import json
import struct
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.jobs.runner import tfrecord
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import gateway, make_images
from tests.support.localserver import LocalServer

MIB = 1024 * 1024
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DATA_LOSS = 3, 8, 15  # google.rpc.Code


def request(
    gw: GatewayProcess, method: str, path: str, body: bytes | None = None, kind: str = ""
) -> tuple[int, bytes]:
    call = urllib.request.Request(gw.http_url + path, data=body, method=method)
    if kind:
        call.add_header("Content-Type", kind)
    try:
        with urllib.request.urlopen(call, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def ok(found: tuple[int, bytes]) -> Any:
    status, body = found
    assert status == 200, body
    return json.loads(body)


class Online:
    """`/ping` and a Detect call over HTTP, back to back in a thread while the hostile jobs
    run; every answer that is not a 200 is kept."""

    def __init__(self, gw: GatewayProcess, image: bytes) -> None:
        self._gw = gw
        self._image = image
        self.calls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for method, path, body, kind in (
                ("GET", "/ping", None, ""),
                ("POST", "/v1/models/detector:detect", self._image, "image/png"),
            ):
                try:
                    status, text = request(self._gw, method, path, body, kind)
                except OSError as e:
                    status, text = 0, str(e).encode()
                self.calls += 1
                if status != 200:
                    self.failures.append(f"{path}: {status} {text[:200]!r}")

    def __enter__(self) -> Online:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@pytest.fixture(scope="module")
def allowed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-datasets")


@pytest.fixture(scope="module")
def gw(
    tfs: LocalServer, allowed: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("hostile-datasets-gateway")
    extra = [f"--batch-allowed-input-uris={allowed}"]
    with gateway(tfs, root / "store", root, extra, http=True) as started:
        yield started


@pytest.fixture
def online(gw: GatewayProcess, scene_png: bytes) -> Iterator[Online]:
    """Online calls running throughout the test; afterwards, none failed, the gateway is
    the same process, alive, and its peak RSS grew by less than 200 MiB."""
    pid = gw.process.pid
    peak = status_kb(pid, "VmHWM")
    with Online(gw, scene_png) as calls:
        yield calls
    assert gw.process.poll() is None and gw.process.pid == pid
    assert calls.calls > 0 and not calls.failures, calls.failures[:5]
    grown = status_kb(pid, "VmHWM") - peak
    assert grown < 200 * 1024, f"the gateway's peak RSS grew by {grown} kB"
    assert not [r for r in gw.records() if "traceback" in json.dumps(r).lower()]


def upload(gw: GatewayProcess, name: str, data: bytes) -> str:
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    kind = f"multipart/form-data; boundary={boundary}"
    return str(ok(request(gw, "POST", "/v1/uploads", body, kind))["upload_id"])


def run_job(gw: GatewayProcess, fields: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({**fields, "model": {"name": "detector"}}).encode()
    op = ok(request(gw, "POST", "/v1/batchJobs", body, "application/json"))
    for _ in range(40):
        op = ok(request(gw, "POST", f"/v1/{op['name']}:wait?timeout=30s"))
        if op["done"]:
            return dict(op)
    raise AssertionError(f"{op['name']} not done: {op}")


def results(gw: GatewayProcess, op: dict[str, Any]) -> list[dict[str, Any]]:
    status, body = request(gw, "GET", f"/v1/{op['name']}/results")
    assert status == 200, body
    return [json.loads(line) for line in body.decode().splitlines()]


def test_a_65_kb_gzip_manifest_of_64_mib_of_zeros_is_a_clear_error(
    gw: GatewayProcess, online: Online
) -> None:
    bomb = gzip.compress(b"0" * (64 * MIB), compresslevel=9)
    assert len(bomb) < 70_000
    op = run_job(gw, {"upload_id": upload(gw, "m.jsonl.gz", bomb)})
    assert "error" not in op, op
    (line,) = results(gw, op)
    assert line["error"]["code"] == INVALID_ARGUMENT
    assert "line 1 is longer than" in line["error"]["message"]
    assert "GATEWAY_MAX_IMAGE_BYTES" in line["error"]["message"]


def test_a_tfrecord_gz_with_a_forged_record_length_is_a_clear_error(
    gw: GatewayProcess, allowed: Path, online: Online, scene_png: bytes
) -> None:
    from gateway.proto.tfswire.v1 import example_pb2

    example = example_pb2.Example()
    example.features.feature["image/encoded"].bytes_list.value.append(scene_png)
    head = struct.pack("<Q", 1 << 40)
    forged = head + struct.pack("<I", tfrecord.masked_crc(head)) + b"\0" * 64
    path = allowed / "forged" / "data.tfrecord.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(tfrecord.encode_record(example.SerializeToString()) + forged))
    op = run_job(gw, {"input_uri": str(path)})
    assert "error" not in op, op
    first, second = results(gw, op)
    assert "result" in first, first
    assert second["error"]["code"] == DATA_LOSS
    assert f"{1 << 40} bytes" in second["error"]["message"]
    assert "GATEWAY_MAX_IMAGE_BYTES" in second["error"]["message"]


def test_an_input_object_of_3_gib_is_refused_from_its_listed_size(
    gw: GatewayProcess, allowed: Path, online: Online
) -> None:
    directory = allowed / "video"
    make_images(directory, 2)
    with open(directory / "movie.mp4", "wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GiB listed, nothing on disk
    op = run_job(gw, {"input_uri": str(directory)})
    assert "error" not in op, op
    lines = {line["id"]: line for line in results(gw, op)}
    assert "result" in lines["img-00000.jpg"] and "result" in lines["img-00001.jpg"]
    error = lines["movie.mp4"]["error"]
    assert error["code"] == INVALID_ARGUMENT, error
    assert f"{3 << 30} bytes" in error["message"] and "GATEWAY_MAX_IMAGE_BYTES" in error["message"]


def test_a_manifest_of_32_mib_of_newlines_fails_the_job_before_a_line_is_written(
    gw: GatewayProcess, online: Online
) -> None:
    op = run_job(gw, {"upload_id": upload(gw, "m.jsonl", b"\n" * (32 * MIB))})
    assert op["error"]["code"] == RESOURCE_EXHAUSTED, op
    assert "GATEWAY_BATCH_MAX_UPLOAD_IMAGES" in op["error"]["message"]
    assert results(gw, op) == []


def test_a_manifest_past_the_decompressed_limit_fails_the_job_naming_it(
    tfs: LocalServer, tmp_path: Path, scene_png: bytes
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "m.jsonl.gz").write_bytes(gzip.compress(b"{}\n" * (8 * MIB), compresslevel=9))
    extra = [f"--batch-allowed-input-uris={data}", f"--batch-max-decompressed-bytes={4 * MIB}"]
    with gateway(tfs, tmp_path / "store", tmp_path, extra, http=True) as small:
        with Online(small, scene_png) as calls:
            op = run_job(small, {"input_uri": str(data / "m.jsonl.gz")})
        assert not calls.failures
        assert op["error"]["code"] == RESOURCE_EXHAUSTED, op
        assert "GATEWAY_BATCH_MAX_DECOMPRESSED_BYTES" in op["error"]["message"]
        assert results(small, op) == []
        assert small.process.poll() is None
