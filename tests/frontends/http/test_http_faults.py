"""The HTTP door when things go wrong: TF Serving slow, failing or down, the gateway full,
callers that hang up, stall or upload 1 GB, and SIGTERM with requests in flight.

Each test runs its own gateway (HTTP door on) in front of tests/support/faultupstream.py, which
forwards to the session's local TF Serving and injects faults.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from serving import scenes
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, closed_port

IMAGE = scenes.encode(scenes.generate_scene(np.random.default_rng(3), 320, 240, 3).pixels, "JPEG")
DETECT = "/v1/models/detector:detect"


@pytest.fixture
def upstream(http_tfs: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(http_tfs.target) as faulty:
        yield faulty


def post(gateway: GatewayProcess, path: str = DETECT, body: bytes = IMAGE) -> tuple[int, dict]:
    request = urllib.request.Request(
        gateway.http_url + path, data=body, headers={"Content-Type": "image/jpeg"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(gateway: GatewayProcess, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(gateway.http_url + path, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def refused_connections(port: int, timeout: float = 60.0) -> None:
    """Returns once connections to `port` are refused; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        except ConnectionRefusedError:
            return
        assert time.monotonic() < deadline, f"port {port} still accepts connections"
        time.sleep(0.02)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_full_gateway_is_429(upstream: FaultyUpstream, tmp_path: Path) -> None:
    with run_gateway(upstream.target, ["--max-concurrent-requests=1"], tmp_path, http=True) as gw:
        upstream.hold()
        first: dict[str, object] = {}
        worker = threading.Thread(target=lambda: first.update(answer=post(gw)))
        worker.start()
        try:
            upstream.wait_active(1)
            status, body = post(gw)
            assert status == 429, body
            assert body["error"]["code"] == "RESOURCE_EXHAUSTED"
            assert "limit of 1 images" in body["error"]["message"]
        finally:
            upstream.release()
            worker.join(60)
        assert first["answer"][0] == 200  # type: ignore[index]


def test_tf_serving_failures_are_503_500_and_504(upstream: FaultyUpstream, tmp_path: Path) -> None:
    # The upstream timeout ends the held call below; the calls before and after it must fit
    # in it on a loaded machine too (1 s did not, twice in 20 runs at load 20).
    timeout = 5.0
    args = [f"--upstream-timeout={timeout:g}", "--upstream-max-attempts=1"]
    with run_gateway(upstream.target, args, tmp_path, http=True) as gw:
        assert post(gw)[0] == 200  # the signature is cached from here on
        upstream.fail_next(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
        status, body = post(gw)
        assert (status, body["error"]["code"]) == (503, "UNAVAILABLE"), body
        upstream.fail_next(grpc.StatusCode.DATA_LOSS, "checksum mismatch")
        status, body = post(gw)
        assert (status, body["error"]["code"]) == (500, "INTERNAL"), body
        upstream.delay = 600.0
        status, body = post(gw)
        assert (status, body["error"]["code"]) == (504, "DEADLINE_EXCEEDED"), body
        # It is the gateway's upstream timeout that ended the call, not the delay: TF Serving
        # was told that timeout (gRPC rounds the header up) and saw the call cancelled.
        *_, left = (left for name, left in upstream.deadlines if name == "Predict")
        assert left is not None and left <= timeout + 0.1
        upstream.wait_cancelled(1)
        upstream.delay = 0.0
        assert post(gw)[0] == 200


def test_ping_is_503_while_tf_serving_is_down(tmp_path: Path) -> None:
    with (
        closed_port() as port,
        run_gateway(f"127.0.0.1:{port}", [], tmp_path, wait_ready=False, http=True) as gw,
    ):
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = get(gw, "/ping")
                break
            except OSError:  # not listening yet
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert status == 503 and body["error"]["code"] == "UNAVAILABLE"
        assert "'detector' is not AVAILABLE" in body["error"]["message"]
        status, body = post(gw)
        assert (status, body["error"]["code"]) == (503, "UNAVAILABLE")
        assert get(gw, "/v1/models/detector")[0] == 503


def test_a_caller_that_hangs_up_cancels_its_request(
    upstream: FaultyUpstream, tmp_path: Path
) -> None:
    """The pipeline records CANCELLED (HTTP 499) and the TF Serving call is cancelled."""
    with run_gateway(upstream.target, [], tmp_path, http=True) as gw:
        assert post(gw)[0] == 200
        upstream.hold()
        try:
            with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
                sock.sendall(
                    f"POST {DETECT} HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                    f"x-request-id: hangs-up\r\nContent-Length: {len(IMAGE)}\r\n\r\n".encode()
                    + IMAGE
                )
                upstream.wait_active(1)
            deadline = time.monotonic() + 60
            while not any(r.get("request_id") == "hangs-up" for r in gw.records()):
                assert time.monotonic() < deadline, "no request log line for the cancelled call"
                time.sleep(0.05)
        finally:
            upstream.release()
        record = next(r for r in gw.records() if r.get("request_id") == "hangs-up")
        assert record["code"] == "CANCELLED" and record["method"] == "POST :detect"
        assert gw.in_flight() == 0


def test_stalled_uploads_time_out_without_taking_a_slot(
    upstream: FaultyUpstream, tmp_path: Path
) -> None:
    args = ["--max-concurrent-requests=1", "--http-body-timeout=1.5", "--http-header-timeout=1.5"]
    with run_gateway(upstream.target, args, tmp_path, http=True) as gw:
        # Taken before the stallers connect, so the time measured is never less than the
        # gateway's own timer (which starts when they connect).
        started = time.monotonic()
        body_staller = socket.create_connection(("127.0.0.1", gw.http_port))
        header_staller = socket.create_connection(("127.0.0.1", gw.http_port))
        try:
            body_staller.sendall(
                f"POST {DETECT} HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                f"Content-Length: {len(IMAGE)}\r\n\r\n".encode()
                + IMAGE[:100]
            )
            header_staller.sendall(f"POST {DETECT} HTTP/1.1\r\nHost: x\r\n".encode())
            # Both stall; the one slot stays free for a real request.
            assert post(gw)[0] == 200
            assert gw.in_flight() == 0
            # The gateway's timers end both (a socket timeout here only bounds the wait).
            body_staller.settimeout(60)
            answer = b""
            while chunk := body_staller.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b'"code":"DEADLINE_EXCEEDED"' in answer
            assert time.monotonic() - started >= 1.5  # not before the body timeout
            header_staller.settimeout(60)
            assert header_staller.recv(65536) == b""  # closed without a request
        finally:
            body_staller.close()
            header_staller.close()
        assert post(gw)[0] == 200


def test_1_gb_upload_is_refused_without_memory_growth(
    upstream: FaultyUpstream, tmp_path: Path
) -> None:
    """A streamed (chunked) 1 GB body and a 1 GB Content-Length: 413, RSS flat."""
    args = ["--max-image-bytes=1048576"]
    with run_gateway(upstream.target, args, tmp_path, http=True) as gw:
        assert post(gw)[0] == 200
        before = rss_mib(gw.process.pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mib(gw.process.pid))
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            command = (
                "head -c 1073741824 /dev/zero | curl -sS -o - -w '\\n%{http_code}' -X POST "
                f"-H 'Content-Type: image/jpeg' -T - {gw.http_url}{DETECT}"
            )
            run = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120)
            with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
                sock.sendall(
                    f"POST {DETECT} HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                    f"Content-Length: {1 << 30}\r\n\r\n".encode()
                    + bytes(65536)
                )
                sock.settimeout(10)
                declared = sock.recv(65536)
        finally:
            done.set()
            sampler.join()
        body, _, code = run.stdout.rpartition(b"\n")
        assert code == b"413", run.stdout[-300:] + run.stderr[-300:]
        assert json.loads(body)["error"]["code"] == "INVALID_ARGUMENT"
        assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
        # The limit is ~2 MiB here: the gateway never held more than a few of them.
        assert peak[0] - before < 32, (before, peak[0])
        assert post(gw)[0] == 200


def test_sigterm_lets_in_flight_http_requests_finish(
    upstream: FaultyUpstream, tmp_path: Path
) -> None:
    with run_gateway(upstream.target, ["--shutdown-grace=20"], tmp_path, http=True) as gw:
        assert post(gw)[0] == 200
        upstream.hold()
        answer: dict[str, object] = {}
        worker = threading.Thread(target=lambda: answer.update(result=post(gw)))
        worker.start()
        upstream.wait_active(1)
        gw.process.send_signal(signal.SIGTERM)
        # The door stops listening (the signal is handled asynchronously: wait for it) while
        # the held request is still in flight; new connections are refused from then on.
        refused_connections(gw.http_port)
        assert upstream.active == 1 and worker.is_alive()
        upstream.release()
        worker.join(30)
        status, body = answer["result"]  # type: ignore[misc]
        assert status == 200 and body["detections"], body
        assert gw.process.wait(30) == 0


def _listeners(port: int) -> int:
    """Sockets listening on `port` (each worker has its own: SO_REUSEPORT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def test_workers_share_the_http_port_too(http_tfs: LocalServer, tmp_path: Path) -> None:
    with run_gateway(http_tfs.target, ["--workers=2"], tmp_path, http=True) as gw:
        deadline = time.monotonic() + 60
        while _listeners(gw.http_port) < 2 or _listeners(gw.port) < 2:
            assert time.monotonic() < deadline, "both workers did not listen on both ports"
            time.sleep(0.1)
        # /ping reaches either worker, and each answers for the pod: ready once both are.
        while gw.serving_workers() != {0, 1}:
            assert time.monotonic() < deadline, "both workers did not become ready"
            time.sleep(0.05)
        assert all(post(gw)[0] == 200 for _ in range(6))
        assert get(gw, "/ping") == (200, {})
        # The supervisor's metrics sum the workers' HTTP requests.
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{gw.metrics_port}/metrics", timeout=10)
            .read()
            .decode()
        )
        assert 'vision_gateway_requests_total{code="OK",method="POST :detect"} 6.0' in text
        assert gw.stop() == 0


def test_tls_settings_cover_the_http_door_too(http_tfs: LocalServer, tmp_path: Path) -> None:
    """The gRPC port's certificate and client CA (mTLS) apply to the HTTP port as well."""
    import ssl

    from tests.support.certs import make_certificates

    certs = make_certificates(tmp_path)
    args = [
        f"--tls-cert-file={certs.server.cert}",
        f"--tls-key-file={certs.server.key}",
        f"--tls-client-ca-file={certs.ca}",
    ]
    with run_gateway(http_tfs.target, args, tmp_path, wait_ready=False, http=True) as gw:
        trusted = ssl.create_default_context(cafile=str(certs.ca))
        trusted.load_cert_chain(str(certs.client.cert), str(certs.client.key))
        url = f"https://127.0.0.1:{gw.http_port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=5, context=trusted) as r:
                    assert r.status == 200
                    break
            except (OSError, urllib.error.HTTPError):
                assert time.monotonic() < deadline, "HTTPS /ping did not answer 200"
                time.sleep(0.2)
        request = urllib.request.Request(
            f"{url}{DETECT}", data=IMAGE, headers={"Content-Type": "image/jpeg"}
        )
        with urllib.request.urlopen(request, timeout=60, context=trusted) as response:
            assert json.loads(response.read())["detections"]
        no_client_cert = ssl.create_default_context(cafile=str(certs.ca))
        with pytest.raises(OSError):  # the handshake fails: mTLS wants a client certificate
            urllib.request.urlopen(f"{url}/ping", timeout=5, context=no_client_cert).read()
        with pytest.raises(OSError):  # plaintext HTTP to a TLS port gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{gw.http_port}/ping", timeout=5).read()
