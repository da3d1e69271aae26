"""components/tls: TLS on the gateway's port from a Secret, and probes that work with it.

Kubernetes' native grpc: probes cannot speak TLS, so the component switches both probes to an
exec probe that runs a gRPC health check over TLS inside the container. Besides the render,
the exact probe command is run against a real gateway with TLS on (its upstream is
bench/upstream.py, a TF Serving stand-in that reports its models AVAILABLE), with only the
port and the CA file's path swapped for the test's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.certs import Certificates, make_certificates
from tests.support.dryrun import render
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import closed_port, free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
TARGET = "overlays/dev-tls"
GATEWAY = "detection-gateway"
MOUNT = "/etc/detection-gateway/tls"
# The model bench/upstream.py serves with a uint8 pixel signature.
UPSTREAM_MODEL = "pixels"


def gateway_container(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = [
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == GATEWAY
    ]
    pod = deployment["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "gateway"]
    return pod, c


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


# ---- the render -----------------------------------------------------------------------------


def test_tls_is_on_with_certificate_and_key_from_the_secret() -> None:
    pod, c = gateway_container(render(TARGET))
    env = env_of(c)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = mounts[MOUNT]
    assert mount["readOnly"] is True
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "detection-gateway-tls"
    assert secret["defaultMode"] == 0o440  # group-readable (fsGroup), not world-readable
    assert env["GATEWAY_TLS_CERT_FILE"] == f"{MOUNT}/tls.crt"
    assert env["GATEWAY_TLS_KEY_FILE"] == f"{MOUNT}/tls.key"
    # The gateway accepts these settings.
    from gateway.flags import parse_settings

    settings = parse_settings([], environ=env)
    assert (settings.tls_cert_file, settings.tls_key_file) == (
        env["GATEWAY_TLS_CERT_FILE"],
        env["GATEWAY_TLS_KEY_FILE"],
    )


def probe_commands() -> dict[str, list[str]]:
    _, c = gateway_container(render(TARGET))
    return {name: c[name]["exec"]["command"] for name in ("readinessProbe", "livenessProbe")}


def test_probes_are_exec_health_checks_over_tls_using_only_the_image() -> None:
    _, c = gateway_container(render(TARGET))
    port = int(env_of(c)["GATEWAY_PORT"])
    commands = probe_commands()
    for name, command in commands.items():
        assert "grpc" not in c[name], name  # the native action is gone, not just shadowed
        assert command[:2] == ["python", "-c"]
        assert command[3] == str(port)
        assert command[5:] == [GATEWAY, f"{MOUNT}/ca.crt"]
    assert commands["readinessProbe"][4] == "detection.v1.DetectionService"
    assert commands["livenessProbe"][4] == "liveness"
    assert commands["readinessProbe"][2] == commands["livenessProbe"][2]
    # The script imports only what the gateway image installs.
    lock = (ROOT / "requirements-gateway.txt").read_text()
    assert "\ngrpcio==" in lock and "\ngrpcio-health-checking==" in lock
    imports = [line for line in commands["readinessProbe"][2].splitlines() if "import" in line]
    assert imports == [
        "import sys, grpc",
        "from grpc_health.v1 import health_pb2, health_pb2_grpc",
    ]


# ---- the probe against a real TLS gateway ---------------------------------------------------


def certificates_for(directory: Path, ca_name: str) -> Certificates:
    """A CA and a server certificate for the probe's server name (and 127.0.0.1)."""
    return make_certificates(directory, ca_name, server_names=(GATEWAY, "127.0.0.1"))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return certificates_for(tmp_path_factory.mktemp("tls"), "probe test CA")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("upstream") / "upstream.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.upstream", f"--port={port}"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while b"bench upstream on" not in log.read_bytes():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "bench upstream did not start"
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(process, 10)


@pytest.fixture
def tls_gateway(
    upstream: str, certificates: Certificates, tmp_path: Path
) -> Iterator[GatewayProcess]:
    cert, key = certificates.server.cert, certificates.server.key
    args = [f"--tls-cert-file={cert}", f"--tls-key-file={key}", f"--model={UPSTREAM_MODEL}"]
    with run_gateway(upstream, args, log_dir=tmp_path, wait_ready=False) as gateway:
        yield gateway


def run_probe(command: list[str], port: int, ca: Path) -> subprocess.CompletedProcess[str]:
    """The manifest's probe command with the test gateway's port and CA file swapped in."""
    assert command[0] == "python"
    argv = [sys.executable, *command[1:3], str(port), command[4], command[5], str(ca)]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        # As in the image: no bytecode written (read-only root filesystem).
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def wait_for_probe(
    command: list[str], port: int, ca: Path, code: int, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout
    while True:
        result = run_probe(command, port, ca)
        if result.returncode == code or time.monotonic() > deadline:
            return result
        time.sleep(0.3)


def test_probe_commands_pass_against_a_serving_tls_gateway_where_native_probes_fail(
    tls_gateway: GatewayProcess, certificates: Certificates
) -> None:
    ca = certificates.ca
    commands = probe_commands()
    ready = wait_for_probe(commands["readinessProbe"], tls_gateway.port, ca, 0)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert ready.stdout.strip() == "SERVING"
    live = run_probe(commands["livenessProbe"], tls_gateway.port, ca)
    assert (live.returncode, live.stdout.strip()) == (0, "SERVING"), live.stderr
    # What the kubelet's native grpc: probe does, a plaintext Health/Check, fails here.
    with (
        grpc.insecure_channel(tls_gateway.target) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="liveness"), timeout=3
        )
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_probe_commands_fail_for_a_gateway_that_is_down_or_untrusted(
    upstream: str, certificates: Certificates, tmp_path: Path
) -> None:
    ca = certificates.ca
    commands = probe_commands()
    # No TF Serving behind the gateway: not ready, but alive (no restart for an upstream outage).
    cert, key = certificates.server.cert, certificates.server.key
    args = [f"--tls-cert-file={cert}", f"--tls-key-file={key}", f"--model={UPSTREAM_MODEL}"]
    with (
        closed_port() as dead,
        run_gateway(f"127.0.0.1:{dead}", args, log_dir=tmp_path, wait_ready=False) as gateway,
    ):
        live = wait_for_probe(commands["livenessProbe"], gateway.port, ca, 0)
        assert live.returncode == 0, live.stdout + live.stderr
        ready = run_probe(commands["readinessProbe"], gateway.port, ca)
        assert (ready.returncode, ready.stdout.strip()) == (1, "NOT_SERVING"), ready.stderr
        # A certificate from another CA is not trusted: the probe fails, it does not skip
        # verification.
        other_ca = certificates_for(tmp_path / "other", "other CA").ca
        untrusted = run_probe(commands["livenessProbe"], gateway.port, other_ca)
        assert untrusted.returncode == 1
        assert "health check failed: UNAVAILABLE" in untrusted.stderr
    # Nothing listening at all.
    gone = run_probe(commands["livenessProbe"], gateway.port, ca)
    assert gone.returncode == 1 and "health check failed: UNAVAILABLE" in gone.stderr
