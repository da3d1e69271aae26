"""Security: TLS and mTLS on the gateway's port and towards TF Serving (certificates made
per test run), no code-executing deserialization in our sources, and no file writes by a
running gateway (so it runs on a read-only root filesystem)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from tests.support import batch
from tests.support.certs import Certificates, Pair, make_certificates
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import ROOT, SERVICE, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, free_port, reserve_port, stop_process

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A second, unrelated CA and its certificates: must never be accepted."""
    return make_certificates(tmp_path_factory.mktemp("other-certs"), ca_name="other CA")


def tls_channel(target: str, ca: Path, client: Pair | None = None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )
    return grpc.secure_channel(target, credentials)


def detect_code(channel: grpc.Channel, request: pb.DetectRequest) -> grpc.StatusCode:
    try:
        pb_grpc.DetectionServiceStub(channel).Detect(request, timeout=30)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def wait_serving(channel: grpc.Channel, timeout: float = 60.0) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status
            if status == SERVING:
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the gateway did not become SERVING over TLS")
        time.sleep(0.1)


@pytest.fixture
def tls_args(certs: Certificates) -> list[str]:
    return [f"--tls-cert-file={certs.server.cert}", f"--tls-key-file={certs.server.key}"]


@pytest.fixture
def tls_gateway(
    tfs: LocalServer, tmp_path: Path, tls_args: list[str], certs: Certificates
) -> Iterator[GatewayProcess]:
    with run_gateway(tfs.target, tls_args, log_dir=tmp_path, wait_ready=False) as gw:
        with tls_channel(gw.target, certs.ca) as channel:
            wait_serving(channel)
        yield gw


# --- TLS on the gateway's port -----------------------------------------------------------


def test_tls_listener_serves_tls_clients_and_refuses_plaintext_and_strangers(
    tls_gateway: GatewayProcess,
    certs: Certificates,
    other_certs: Certificates,
    request_small: pb.DetectRequest,
) -> None:
    with tls_channel(tls_gateway.target, certs.ca) as channel:
        assert detect_code(channel, request_small) == grpc.StatusCode.OK
    with grpc.insecure_channel(tls_gateway.target) as channel:
        assert detect_code(channel, request_small) == grpc.StatusCode.UNAVAILABLE
    # A client that trusts another CA does not accept the gateway's certificate.
    with tls_channel(tls_gateway.target, other_certs.ca) as channel:
        assert detect_code(channel, request_small) == grpc.StatusCode.UNAVAILABLE
    requests = [r for r in tls_gateway.records() if r.get("method") == "Detect"]
    assert [r["code"] for r in requests] == ["OK"]  # the refused ones never got in
    [started] = [r for r in tls_gateway.records() if r["message"] == "gateway listening"]
    assert started["tls"] == "tls"


def test_mtls_listener_admits_only_clients_with_a_certificate_from_its_ca(
    tfs: LocalServer,
    tmp_path: Path,
    tls_args: list[str],
    certs: Certificates,
    other_certs: Certificates,
    request_small: pb.DetectRequest,
) -> None:
    args = [*tls_args, f"--tls-client-ca-file={certs.ca}"]
    with run_gateway(tfs.target, args, log_dir=tmp_path, wait_ready=False) as gw:
        with tls_channel(gw.target, certs.ca, certs.client) as channel:
            wait_serving(channel)
            assert detect_code(channel, request_small) == grpc.StatusCode.OK
        with tls_channel(gw.target, certs.ca) as channel:  # no client certificate
            assert detect_code(channel, request_small) == grpc.StatusCode.UNAVAILABLE
        with tls_channel(gw.target, certs.ca, other_certs.client) as channel:
            assert detect_code(channel, request_small) == grpc.StatusCode.UNAVAILABLE
        oks = [r for r in gw.records() if r.get("method") == "Detect"]
    assert [r["code"] for r in oks] == ["OK"]


def test_the_batch_runner_reaches_an_mtls_gateway_with_a_certificate_from_its_ca_only(
    tfs: LocalServer,
    tmp_path: Path,
    tls_args: list[str],
    certs: Certificates,
    other_certs: Certificates,
    scene_png: bytes,
) -> None:
    source = tmp_path / "images"
    source.mkdir()
    names = [f"scene-{n}.png" for n in range(3)]
    for name in names:
        (source / name).write_bytes(scene_png)
    args = [*tls_args, f"--tls-client-ca-file={certs.ca}"]
    with run_gateway(tfs.target, args, log_dir=tmp_path, wait_ready=False) as gw:
        with tls_channel(gw.target, certs.ca, certs.client) as channel:
            wait_serving(channel)

        def runner(client: Pair, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
            return batch.run(
                [str(source), str(out), "--target", gw.target, "--ca-file", str(certs.ca),
                 "--cert-file", str(client.cert), "--key-file", str(client.key), *extra],
            )  # fmt: skip

        refused = runner(other_certs.client, tmp_path / "refused", "--give-up-after", "2")
        summary = batch.ok(runner(certs.client, tmp_path / "out"))
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert f"no answer from the gateway at {gw.target}" in refused.stderr
    assert "GATEWAY_TLS_CLIENT_CA_FILE" in refused.stderr  # what to check, not only "closed"
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "refused" / "results-00000-of-00001.jsonl").exists()
    assert summary["images"] == 3 and summary["codes"] == {"OK": 3}
    results = batch.lines(tmp_path / "out" / "results-00000-of-00001.jsonl")
    assert [line["id"] for line in results] == names
    assert all(line["result"]["detections"] for line in results)


# --- TLS and mTLS to TF Serving ----------------------------------------------------------


def _server_credentials(certs: Certificates, client_ca: bool) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(certs.server.key.read_bytes(), certs.server.cert.read_bytes())],
        root_certificates=certs.ca.read_bytes() if client_ca else None,
        require_client_auth=client_ca,
    )


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls_to_tf_serving(
    mutual: bool,
    tfs: LocalServer,
    tmp_path: Path,
    certs: Certificates,
    other_certs: Certificates,
    request_small: pb.DetectRequest,
) -> None:
    client = [
        f"--upstream-cert-file={certs.client.cert}",
        f"--upstream-key-file={certs.client.key}",
    ]
    good = [f"--upstream-ca-file={certs.ca}", *(client if mutual else [])]
    with FaultyUpstream(tfs.target, _server_credentials(certs, mutual)) as upstream:
        with run_gateway(upstream.target, good, log_dir=tmp_path) as gw:
            with gw.channel() as channel:
                assert detect_code(channel, request_small) == grpc.StatusCode.OK
            [started] = [r for r in gw.records() if r["message"] == "gateway listening"]
            assert started["upstream_tls"] == ("mtls" if mutual else "tls")
        bad = [
            ["--upstream-ca-file=" + str(other_certs.ca), *(client if mutual else [])],
            ["--upstream-tls=false"],  # plaintext to a TLS port
        ]
        if mutual:
            bad.append([f"--upstream-ca-file={certs.ca}"])  # no client certificate
        for args in bad:
            with run_gateway(upstream.target, args, log_dir=tmp_path, wait_ready=False) as gw:
                gw.wait_health(SERVING, "liveness")  # the gateway is up, TF Serving is not
                with gw.channel() as channel, pytest.raises(grpc.RpcError) as info:
                    gw.stub(channel).Detect(request_small, timeout=30)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert f"TF Serving at {upstream.target} is unavailable" in info.value.details()
                assert gw.health(SERVICE) != SERVING
        assert upstream.calls["Predict"] == 1  # only the trusted gateway got through


def test_unreadable_certificate_is_a_one_line_startup_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    for args in (
        [f"--tls-cert-file={missing}", f"--tls-key-file={missing}"],
        [f"--upstream-ca-file={missing}"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={free_port()}",
             "--metrics-port=0", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode != 0
        assert result.stderr.strip().count("\n") == 0, result.stderr
        assert "cannot read" in result.stderr and str(missing) in result.stderr


# --- no code-executing deserialization ---------------------------------------------------

FORBIDDEN = re.compile(
    r"\b(import pickle|from pickle|pickle\.loads?|cPickle|import marshal|marshal\.loads?|shelve"
    r"|dill|jsonpickle|joblib\.load|torch\.load|yaml\.load\(|yaml\.unsafe_load|eval\(|exec\("
    r"|allow_pickle\s*=\s*True|__reduce__)"
)


def test_no_pickle_eval_or_unsafe_yaml_in_our_sources() -> None:
    sources = [
        p
        for folder in ("gateway", "serving", "bench")
        for p in (ROOT / folder).rglob("*.py")
        if "proto" not in p.relative_to(ROOT).parts[1:2]
    ]
    assert len(sources) > 20
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in sources
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert hits == []


# --- no writes: a read-only root filesystem is enough -------------------------------------

# Runs the gateway with an audit hook that reports every file opened for writing and every
# filesystem change Python makes (CPython audit events), one JSON line each on stderr.
AUDITED = """
import json, os, runpy, sys
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
CHANGES = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.truncate", "os.symlink",
           "os.link", "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.copyfile",
           "shutil.move", "tempfile.mkstemp", "tempfile.mkdtemp", "sqlite3.connect"}
def hook(event, args):
    written = False
    if event == "open":
        path, mode, flags = args
        written = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS)
    if written or event in CHANGES:
        sys.__stderr__.write(json.dumps({"audit": event, "args": repr(args)}) + "\\n")
sys.addaudithook(hook)
module = os.environ.get("AUDITED_MODULE", "gateway")
sys.argv = [module, *sys.argv[1:]]
runpy.run_module(module, run_name="__main__")
"""


def audit_lines(text: str) -> list[dict[str, str]]:
    return [json.loads(x) for x in text.splitlines() if x.startswith('{"audit"')]


def test_the_write_audit_sees_a_write(tmp_path: Path) -> None:
    source, target = tmp_path / "in.json", tmp_path / "out.json"
    source.write_text("{}")
    result = subprocess.run(
        [sys.executable, "-c", AUDITED, str(source), str(target)],
        env={**os.environ, "AUDITED_MODULE": "json.tool"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert target.exists()
    assert [line["audit"] for line in audit_lines(result.stderr)] == ["open"]
    assert str(target) in audit_lines(result.stderr)[0]["args"]


def test_running_gateway_writes_no_files(
    tfs: LocalServer, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    home = tmp_path / "readonly-home"
    home.mkdir()
    home.chmod(0o555)  # read-only for a non-root user (CI); the audit hook covers root
    (tmp_path / "jobs").mkdir()  # its job store (below), empty
    env = {
        **os.environ,
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(ROOT),
        # A job store of its own: the default one (/tmp/detection-gateway-jobs) is shared
        # with other runs (make run's, the docs' commands).
        "GATEWAY_JOB_STORE": str(tmp_path / "jobs"),
    }
    # The gRPC port is held while the gateway runs (it binds with SO_REUSEPORT); a metrics
    # port taken meanwhile would stop the gateway loudly.
    with reserve_port() as port:
        metrics_port = free_port()
        log = tmp_path / "gateway.log"
        command = [
            sys.executable, "-c", AUDITED, "--host=127.0.0.1", f"--port={port}",
            f"--metrics-port={metrics_port}", f"--upstream={tfs.target}", "--health-interval=0.3",
        ]  # fmt: skip
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        gw = GatewayProcess(process, port, metrics_port, log)
        try:
            gw.wait_health(SERVING, SERVICE)
            with gw.channel() as channel:
                assert detect_code(channel, request_small) == grpc.StatusCode.OK
                assert detect_code(channel, pb.DetectRequest(image=b"junk")) != grpc.StatusCode.OK
            gw.in_flight()  # the metrics endpoint
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0
        finally:
            stop_process(process, 30)
    # Its one place to write is its job store (batch jobs' records and leases: an emptyDir
    # or a bucket in the manifests).
    store = str(tmp_path / "jobs")
    assert [line for line in audit_lines(log.read_text()) if store not in line["args"]] == []
    assert any(r.get("message") == "stopped" for r in gw.records())
    assert list(home.iterdir()) == []
