"""Places a caller may not touch (issue 33 item 4), through the real doors: the job store and
its ancestors, other callers' outputs, and URLs built to be read one way and fetched another
(a real HTTP server on loopback counts every request the gateway sends).

Rows of the attack table in docs/security.md, each proved by the test named after it.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
from PIL import Image

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import batch_pb2 as bpb
from tests.support import tools
from tests.support.certs import Certificates, make_certificates
from tests.support.jobs import (
    MODEL_CONFIG,
    Client,
    State,
    channel,
    gateway,
    make_images,
    metadata,
    options,
)
from tests.support.localserver import LocalServer

ALICE = "spiffe://test.local/ns/shop/sa/alice"
BOB = "spiffe://test.local/ns/shop/sa/bob"
Code = grpc.StatusCode


def refused(call: object, *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)  # type: ignore[operator]
        if hasattr(result, "__iter__") and not isinstance(result, bytes | str):
            list(result)
    return info.value


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (20, 90, 160)).save(buffer, "JPEG")
    return buffer.getvalue()


def start(tfs: LocalServer, store: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`python -m gateway` with `flags`, expected to stop at startup."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", "--port=0", "--metrics-port=0",
         f"--upstream={tfs.target}", f"--model-config={MODEL_CONFIG}", f"--job-store={store}",
         *flags],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    names = {"alice": ALICE, "bob": BOB}
    return make_certificates(tmp_path_factory.mktemp("places-certs"), clients=names)


def test_prefixes_overlapping_the_job_store_stop_the_gateway_at_startup(
    tfs: LocalServer, tmp_path: Path
) -> None:
    """One bucket for data and store, as components/jobs suggests: allowing the bucket, the
    store or a place in it would let callers read each other's uploads and results."""
    store = tmp_path / "store"
    for flag in (
        f"--batch-allowed-input-uris={tmp_path}",
        f"--batch-allowed-input-uris={tmp_path / 'data'},{store}",
        f"--batch-allowed-input-uris={store / 'uploads'}",
        f"--batch-allowed-uris={tmp_path}",
        f"--batch-allowed-uris={store / 'jobs'}",
    ):
        done = start(tfs, store, flag)
        setting = flag.removeprefix("--").split("=")[0].upper().replace("-", "_")
        assert done.returncode != 0, flag
        assert f"GATEWAY_{setting}" in done.stderr and "overlaps the job store" in done.stderr
        assert "Traceback" not in done.stderr
    done = start(tfs, store, "--batch-allowed-input-uris=http://h/a/%2e%2e/b")
    assert done.returncode != 0 and "not a prefix the gateway can compare" in done.stderr


def test_the_job_store_is_never_an_input_whatever_paths_globs_or_manifest_lines_say(
    tfs: LocalServer, certs: Certificates, tmp_path: Path
) -> None:
    """Bob's upload and Alice's own results in the store: input_uri naming the store, its
    parent, a glob into it, a symlink to it from an allowed directory, and an uploaded
    manifest naming them line by line are PERMISSION_DENIED; the manifest's own images run."""
    data, store = tmp_path / "data", tmp_path / "store"
    make_images(data / "set", 1)
    (data / "to-store").symlink_to(store)
    extra = [f"--batch-allowed-input-uris={data}"]
    with gateway(tfs, store, tmp_path, extra, certs) as gw:
        with channel(gw, certs, "bob") as opened:
            bob = Client(opened)
            theirs = bob.batch.UploadImages(
                iter([bpb.UploadImagesRequest(name="b.jpg", image=jpeg())]), timeout=30
            ).upload_id
        with channel(gw, certs, "alice") as opened:
            alice = Client(opened)
            earlier = alice.wait(alice.create(input_uri=str(data / "set")).name)
            results = next(Path(metadata(earlier).output_uri).glob("*.jsonl"))
            their_image = store / "uploads" / theirs / "b.jpg"
            for url in (
                str(store),
                str(tmp_path),
                str(store / "uploads" / theirs),
                str(their_image),
                f"file://{their_image}",
                f"{store}/uploads/*/*.jpg",
                f"{tmp_path}/*/uploads/*",
                str(data / "to-store" / "uploads" / theirs),
                str(results),
            ):
                error = refused(alice.create, input_uri=url)
                assert error.code() == Code.PERMISSION_DENIED, (url, error.details())
            lines = [
                {"image_bytes": base64.b64encode(jpeg()).decode()},
                {"image": f"../{theirs}/b.jpg"},
                {"image": str(their_image)},
                {"image": f"file://{their_image}"},
                {"image": str(results)},
                {"image": f"{data}/to-store/uploads/{theirs}/b.jpg"},
                {"image": f"{data}/set/img-00000.jpg"},
            ]
            body = "".join(json.dumps(line) + "\n" for line in lines).encode()
            upload = alice.batch.UploadImages(
                iter([bpb.UploadImagesRequest(name="list.jsonl", image=body)]), timeout=30
            )
            got = alice.lines(alice.wait(alice.create(upload_id=upload.upload_id).name).name)
    assert [x.HasField("result") for x in got] == [True, False, False, False, False, False, True]
    assert {x.error.code for x in got[1:6]} == {Code.PERMISSION_DENIED.value[0]}


def test_an_output_belongs_to_the_caller_whose_job_wrote_it_first(
    tfs: LocalServer, certs: Certificates, tmp_path: Path
) -> None:
    """Bob names Alice's output_uri, with her exact spec and with another: PERMISSION_DENIED
    in the words an output outside the prefixes gets (nothing of Alice's job in them, no
    file of hers touched), on both doors; Alice runs there again."""
    data, allowed = tmp_path / "data", tmp_path / "out"
    make_images(data / "set", 2)
    extra = [f"--batch-allowed-input-uris={data}", f"--batch-allowed-uris={allowed}"]
    area = allowed / "alice-run"
    spec = {
        "input_uri": str(data / "set"),
        "output_uri": str(area),
        "options": options(pb.DetectRequest(min_score=0.375)),
    }
    with gateway(tfs, tmp_path / "store", tmp_path, extra, certs, http=True) as gw:
        with channel(gw, certs, "alice") as opened:
            alice = Client(opened)
            done = alice.wait(alice.create(**spec).name)
            assert metadata(done).state == State.SUCCEEDED
        before = {p: p.stat().st_mtime_ns for p in area.rglob("*")}
        assert json.loads((area / "_batch" / "owner.json").read_text()) == {
            "caller": f"uri:{ALICE}"
        }
        with channel(gw, certs, "bob") as opened:
            bob = Client(opened)
            messages = set()
            other = {**spec, "options": options(pb.DetectRequest(min_score=0.5))}
            for attempt in (spec, other, {**spec, "output_uri": "/elsewhere"}):
                error = refused(bob.create, **attempt)
                assert error.code() == Code.PERMISSION_DENIED, error.details()
                messages.add(error.details().replace(attempt["output_uri"], "<output>"))
        assert len(messages) == 1, messages
        (message,) = messages
        for secret in (str(data), "0.375", "detector", ALICE):
            assert secret not in message
        pair = certs.clients["bob"]
        as_json = {**spec, "options": {"min_score": 0.375}}  # the HTTP door's plain form
        https = gw.http_url.replace("http://", "https://")
        curl = tools.binary("curl", tools.CURL_INSTALL)
        answer = subprocess.run(
            [curl, "-sS", "--max-time", "60", "--cacert", str(certs.ca), "--cert",
             str(pair.cert), "--key", str(pair.key), "-H", "Content-Type: application/json",
             "--data-binary", json.dumps(as_json), "-w", "\n%{http_code}",
             f"{https}/v1/batchJobs"],
            capture_output=True, text=True, timeout=90, check=True,
        )  # fmt: skip
        text, _, status = answer.stdout.rpartition("\n")
        assert status == "403"
        found = json.loads(text)["error"]
        assert found["message"].replace(str(area), "<output>") == message
        assert {p: p.stat().st_mtime_ns for p in area.rglob("*")} == before
        with channel(gw, certs, "alice") as opened:
            again = Client(opened).wait(Client(opened).create(**spec).name)
            assert metadata(again).state == State.SUCCEEDED


class Counting(http.server.BaseHTTPRequestHandler):
    """Serves /public/x.jpg and /secret; records every request line."""

    seen: ClassVar[list[str]] = []
    image = b""

    def _answer(self, body: bool) -> None:
        self.seen.append(f"{self.command} {self.path}")
        data = {"/public/x.jpg": self.image, "/secret": b"secret"}.get(self.path)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web() -> Iterator[tuple[str, list[str]]]:
    Counting.seen = []
    Counting.image = jpeg()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", Counting.seen
    finally:
        server.shutdown()
        server.server_close()


def test_urls_are_compared_parsed_and_nothing_outside_is_fetched(
    tfs: LocalServer, tmp_path: Path, web: tuple[str, list[str]]
) -> None:
    """Allowed: http://<server>/public and http://allowed.example/public. URLs that a naive
    normalisation puts inside (a fragment, `..`, `%2e%2e`, user information, a query, another
    port) are PERMISSION_DENIED with not one request sent; one inside is read."""
    host, seen = web
    allowed = f"http://{host}/public,http://allowed.example/public"
    extra = [f"--batch-allowed-input-uris={allowed}"]
    with gateway(tfs, tmp_path / "store", tmp_path, extra) as gw, gw.channel() as opened:
        client = Client(opened)
        port = int(host.rsplit(":", 1)[1])
        for url in (
            f"http://{host}/secret#/../../allowed.example/public/x.png",
            "http://allowed.example/public/%2e%2e/admin/x.png",
            f"http://{host}/public/%2e%2e/secret",
            f"http://{host}/public/%2E%2E/secret",
            f"http://{host}/public%2f..%2fsecret",
            f"http://{host}/public/../secret",
            f"http://{host}/public/./../secret",
            f"http://{host}/public\\..\\secret",
            f"http://user@{host}/public/x.jpg",
            f"http://allowed.example@{host}/secret",
            f"http://{host}/public/x.jpg?next=/secret",
            f"http://{host}/publicity/x.jpg",
            f"http://127.0.0.1:{port + 1}/public/x.jpg",
            f"https://{host}/public/x.jpg",
            f"simplecache::http://{host}/public/x.jpg",
        ):
            error = refused(client.create, input_uri=url)
            assert error.code() == Code.PERMISSION_DENIED, (url, error.details())
        assert seen == []
        done = client.wait(client.create(input_uri=f"http://{host}/public/x.jpg").name)
        assert metadata(done).state == State.SUCCEEDED
        (line,) = client.lines(done.name)
        assert line.HasField("result")
    assert seen and all(request.split(" ")[1] == "/public/x.jpg" for request in seen), seen
