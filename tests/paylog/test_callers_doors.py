"""Payload logging per caller through the real doors: a gateway process with mTLS, callers
with client certificates (tests/support/certs.py) on gRPC and HTTP, and the payload log going
to a real HTTP collector on loopback. Each caller is logged as its table says (rate, images),
a caller at rate 0 never, and a changed sampling file is taken up while the gateway runs."""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import grpc
import numpy as np
import pytest

from gateway.api.channel import open_channel
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.tls import TLS
from serving import scenes
from tests.support.certs import Certificates, make_certificates
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.jobs import _wait_serving
from tests.support.localserver import LocalServer

AUDITED = "spiffe://test.local/ns/shop/sa/audited"
ADS = "spiffe://test.local/ns/ads/sa/banner"
QUIET = "spiffe://test.local/ns/shop/sa/quiet"
SAMPLING = f"""
[default]
rate = 0

[callers."uri:{AUDITED}"]
rate = 1
images = "full"

[callers."uri:spiffe://test.local/ns/ads/*"]
rate = 1
"""
IMAGE = scenes.encode(scenes.generate_scene(np.random.default_rng(5), 96, 80, 2).pixels, "JPEG")
pytestmark = pytest.mark.slow  # a gateway process and the local TF Serving


class Collector(BaseHTTPRequestHandler):
    """A CloudEvents sink: keeps each POST's headers and body."""

    events: ClassVar[list[tuple[dict[str, str], bytes]]] = []
    arrived: ClassVar[threading.Condition] = threading.Condition()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        with Collector.arrived:
            Collector.events.append(({k.lower(): v for k, v in self.headers.items()}, body))
            Collector.arrived.notify_all()
        self.send_response(202)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def wait_for_events(count: int, timeout: float = 60.0) -> list[tuple[dict[str, str], bytes]]:
    with Collector.arrived:
        assert Collector.arrived.wait_for(lambda: len(Collector.events) >= count, timeout), (
            f"{len(Collector.events)} of {count} events came"
        )
        return list(Collector.events)


@pytest.fixture(scope="module")
def collector() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/events"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving with every reference model (tests/conftest.py)."""
    return reference_serving


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    names = {"audited": AUDITED, "ads": ADS, "quiet": QUIET}
    return make_certificates(tmp_path_factory.mktemp("paylog-certs"), clients=names)


def channel(gw: GatewayProcess, certs: Certificates, client: str) -> grpc.Channel:
    pair = certs.clients[client]
    return open_channel(gw.target, TLS(str(certs.ca), str(pair.cert), str(pair.key)))


def detect(gw: GatewayProcess, certs: Certificates, client: str, request_id: str) -> None:
    with channel(gw, certs, client) as open_:
        stub = pb_grpc.DetectionServiceStub(open_)
        stub.Detect(pb.DetectRequest(image=IMAGE, request_id=request_id), timeout=60)


def detect_http(gw: GatewayProcess, certs: Certificates, client: str) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(certs.ca))
    pair = certs.clients[client]
    context.load_cert_chain(str(pair.cert), str(pair.key))
    request = urllib.request.Request(
        f"https://127.0.0.1:{gw.http_port}/v1/models/detector:detect",
        data=IMAGE,
        headers={"Content-Type": "image/jpeg"},
    )
    with urllib.request.urlopen(request, timeout=60, context=context) as answer:
        return dict(json.loads(answer.read()))


def test_each_caller_is_logged_as_its_table_says_and_a_change_is_taken_up(
    collector: str, tfs: LocalServer, certs: Certificates, tmp_path: Path
) -> None:
    Collector.events = []
    sampling = tmp_path / "paylog.toml"
    sampling.write_text(SAMPLING)
    args = [
        f"--payload-log={collector}",
        f"--payload-log-config={sampling}",
        f"--tls-cert-file={certs.server.cert}",
        f"--tls-key-file={certs.server.key}",
        f"--tls-client-ca-file={certs.ca}",
    ]
    with run_gateway(tfs.target, args, log_dir=tmp_path, wait_ready=False, http=True) as gw:
        with channel(gw, certs, "audited") as ready:
            _wait_serving(ready)
        detect(gw, certs, "quiet", "quiet-1")  # rate 0: never logged
        detect(gw, certs, "audited", "audited-1")
        answered = detect_http(gw, certs, "audited")
        detect(gw, certs, "ads", "ads-1")
        events = wait_for_events(3)
        by_request = {
            headers["ce-requestid"]: (headers, json.loads(body)) for headers, body in events
        }
        assert set(by_request) == {"audited-1", answered["request_id"], "ads-1"}
        headers, data = by_request["audited-1"]
        assert headers["ce-caller"] == f"uri:{AUDITED}" and headers["ce-code"] == "OK"
        assert headers["ce-specversion"] == "1.0" and headers["ce-modelversion"] == "1"
        assert base64.b64decode(data["request"]["image"]["data"]) == IMAGE
        assert data["request"]["method"] == "Detect"
        assert data["response"]["result"]["detections"]
        _, http_data = by_request[answered["request_id"]]
        assert http_data["request"]["method"] == "POST :detect"
        # What the HTTP door answered is what was logged, field for field.
        assert http_data["response"]["result"] == answered
        ads_headers, ads_data = by_request["ads-1"]
        assert ads_headers["ce-caller"] == f"uri:{ADS}"
        assert ads_data["request"]["image"] == {
            "sha256": hashlib.sha256(IMAGE).hexdigest(), "size": len(IMAGE)
        }  # fmt: skip

        sampling.write_text(SAMPLING.replace("rate = 0", "rate = 1", 1))
        deadline = time.monotonic() + 60
        attempt = 0
        while True:  # the file is looked at once a second: calls until one is logged
            attempt += 1
            detect(gw, certs, "quiet", f"quiet-after-{attempt}")
            with Collector.arrived:
                Collector.arrived.wait_for(lambda: len(Collector.events) > 3, 0.5)
                logged = [h["ce-requestid"] for h, _ in Collector.events[3:]]
            if logged:
                break
            assert time.monotonic() < deadline, "the changed sampling file was not taken up"
        assert logged == [f"quiet-after-{attempt}"]
        assert "quiet-1" not in {h["ce-requestid"] for h, _ in Collector.events}
