"""Batch jobs over the HTTP door for one caller, whichever door and whichever replica: mTLS on
both doors with real client certificates (a SPIFFE ID and a common name), the real curl, the
same operations through gRPC for the same caller and none of another caller's; two gateway
processes on one job store, each answering for what was created on the other."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.certs import Certificates, make_certificates
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.jobs import Client, make_images, ran
from tests.support.jobshttp import curl, ndjson, ok, refused, wait_done
from tests.support.localserver import LocalServer

# --- one caller's operations, whichever door ------------------------------------------------


def caller_certificates(directory: Path) -> Certificates:
    """A CA, the server's certificate and two callers': alice (a SPIFFE ID) and bob (a CN)."""
    return make_certificates(
        directory, clients={"alice": "spiffe://cluster.local/ns/a/sa/alice", "bob": ""}
    )


def as_client(certs: Certificates, name: str) -> tuple[str, ...]:
    """curl's arguments to call as the client `name` of certs.clients."""
    pair = certs.clients[name]
    return ("--cacert", str(certs.ca), "--cert", str(pair.cert), "--key", str(pair.key))


@contextmanager
def tls_jobs_gateway(
    upstream: str, http_repo: Path, store: Path, certs: Certificates, log_dir: Path
) -> Iterator[GatewayProcess]:
    """A gateway with the jobs API and mTLS on both doors, once it is SERVING."""
    args = [
        f"--model-config={http_repo / 'gateway-models.toml'}",
        f"--job-store={store}",
        f"--tls-cert-file={certs.server.cert}",
        f"--tls-key-file={certs.server.key}",
        f"--tls-client-ca-file={certs.ca}",
    ]
    with run_gateway(upstream, args, log_dir=log_dir, http=True, wait_ready=False) as gw:
        with alice_channel(gw, certs) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="detection.v1.DetectionService")
            deadline = time.monotonic() + 120
            while not _serving(health, request):
                assert time.monotonic() < deadline, "the gateway did not turn SERVING over TLS"
                time.sleep(0.1)
        yield gw


def https_url(gateway: GatewayProcess) -> str:
    return gateway.http_url.replace("http://", "https://")


@pytest.fixture(scope="module")
def tls_gateway(
    http_tfs: LocalServer, http_repo: Path, tmp_path_factory
) -> Iterator[tuple[GatewayProcess, Any]]:
    certs = caller_certificates(tmp_path_factory.mktemp("http-jobs-certs"))
    store = tmp_path_factory.mktemp("http-jobs-tls-store")
    log_dir = tmp_path_factory.mktemp("http-jobs-tls-logs")
    with tls_jobs_gateway(http_tfs.target, http_repo, store, certs, log_dir) as gw:
        yield gw, certs


def _serving(health: Any, request: Any) -> bool:
    try:
        return bool(
            health.Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        )
    except grpc.RpcError:
        return False


def alice_channel(gateway: GatewayProcess, certs: Any) -> grpc.Channel:
    alice = certs.clients["alice"]
    credentials = grpc.ssl_channel_credentials(
        certs.ca.read_bytes(), alice.key.read_bytes(), alice.cert.read_bytes()
    )
    return grpc.secure_channel(gateway.target.replace("127.0.0.1", "localhost"), credentials)


def test_an_operation_belongs_to_its_caller_on_both_doors(tls_gateway, tmp_path: Path) -> None:
    gateway, certs = tls_gateway
    url = https_url(gateway)
    as_alice, as_bob = as_client(certs, "alice"), as_client(certs, "bob")
    image = make_images(tmp_path, 1)[0]
    upload = ok(curl(f"{url}/v1/uploads", f"-Fimage=@{image}", *as_alice))
    op = ok(
        curl(
            f"{url}/v1/batchJobs", "-X", "POST", "-H", "Content-Type: application/json",
            "--data-binary", json.dumps({"upload_id": upload["upload_id"]}), *as_alice,
        )
    )  # fmt: skip
    name = op["name"]
    # For bob it does not exist: the message of a name never created.
    mine = refused(curl(f"{url}/v1/{name}", *as_bob), 404, "NOT_FOUND")
    never = refused(curl(f"{url}/v1/operations/0123abcd", *as_bob), 404, "NOT_FOUND")
    assert mine.replace(name, "X") == never.replace("operations/0123abcd", "X")
    for method, path in [
        ("POST", f"/v1/{name}:cancel"),
        ("POST", f"/v1/{name}:wait?timeout=1s"),
        ("DELETE", f"/v1/{name}"),
        ("GET", f"/v1/{name}/results"),
    ]:
        refused(curl(url + path, "-X", method, *as_bob), 404, "NOT_FOUND")
    assert name not in {o["name"] for o in ok(curl(f"{url}/v1/operations", *as_bob))["operations"]}
    refused(
        curl(f"{url}/v1/uploads", f"-Fupload_id={upload['upload_id']}", f"-Fimage=@{image}",
             *as_bob),
        404,
        "NOT_FOUND",
    )  # fmt: skip

    # Alice sees it over gRPC with the same certificate: one identity, both doors.
    with alice_channel(gateway, certs) as channel:
        assert Client(channel).wait(name).name == name
    assert wait_done(gateway, name, *as_alice, url=url)["metadata"]["state"] == "SUCCEEDED"


def create_job(url: str, body: dict[str, Any], *args: str) -> Any:
    return ok(
        curl(
            f"{url}/v1/batchJobs", "-X", "POST", "-H", "Content-Type: application/json",
            "--data-binary", json.dumps(body), *args,
        )
    )  # fmt: skip


def test_two_replicas_answer_for_a_callers_operations_over_curl(
    http_tfs: LocalServer, http_repo: Path, tmp_path: Path
) -> None:
    """Two gateway processes, mTLS on both doors, share one job store: operations created
    with curl on A are read, waited on, cancelled and deleted with curl through B (A runs
    them), and for another caller they do not exist on B either. TF Serving sits behind a
    proxy that counts the Predicts and holds them for the job cancelled while it runs."""
    certs = caller_certificates(tmp_path / "certs")
    store = tmp_path / "store"
    as_alice, as_bob = as_client(certs, "alice"), as_client(certs, "bob")
    paths = make_images(tmp_path / "images", 3)
    with (
        FaultyUpstream(http_tfs.target) as upstream,
        tls_jobs_gateway(upstream.target, http_repo, store, certs, tmp_path) as a,
        tls_jobs_gateway(upstream.target, http_repo, store, certs, tmp_path) as b,
    ):
        on_a, on_b = https_url(a), https_url(b)
        upload = ok(curl(f"{on_a}/v1/uploads", *(f"-Fimage=@{p}" for p in paths), *as_alice))
        job = {"upload_id": upload["upload_id"], "model": {"name": "detector"}}
        name = create_job(on_a, job, *as_alice)["name"]

        # Read and waited on through B; its results streamed from B.
        assert ok(curl(f"{on_b}/v1/{name}", *as_alice))["name"] == name
        done = wait_done(b, name, *as_alice, url=on_b)
        assert done["metadata"]["state"] == "SUCCEEDED", done
        assert done["response"]["code_counts"] == {"OK": "3"}
        status, headers, body = curl(f"{on_b}/v1/{name}/results", *as_alice)
        assert status == 200 and headers["content-type"] == "application/x-ndjson", body
        assert [line["id"] for line in ndjson(body)] == [p.name for p in paths]
        assert ok(curl(f"{on_a}/v1/{name}", *as_alice)) == done
        assert ran(a, name) and not ran(b, name)
        assert upstream.calls["Predict"] == len(paths)  # each image reached TF Serving once

        # A job held in TF Serving while A runs it, cancelled through B.
        upstream.hold()
        running = create_job(on_a, job, *as_alice)["name"]
        upstream.wait_active(1)
        assert ran(a, running) and not ran(b, running)
        # For bob, through B, alice's operations do not exist: nothing he asks changes them.
        for op in (name, running):
            for method, path in [
                ("GET", f"/v1/{op}"),
                ("POST", f"/v1/{op}:wait?timeout=1s"),
                ("POST", f"/v1/{op}:cancel"),
                ("DELETE", f"/v1/{op}"),
                ("GET", f"/v1/{op}/results"),
            ]:
                refused(curl(on_b + path, "-X", method, *as_bob), 404, "NOT_FOUND")
        assert ok(curl(f"{on_b}/v1/operations", *as_bob))["operations"] == []
        listed = ok(curl(f"{on_b}/v1/operations", *as_alice))["operations"]
        assert {o["name"] for o in listed} == {name, running}
        assert ok(curl(f"{on_b}/v1/{running}", *as_alice))["metadata"]["state"] == "RUNNING"

        assert ok(curl(f"{on_b}/v1/{running}:cancel", "-X", "POST", *as_alice)) == {}
        cancelled = wait_done(b, running, *as_alice, url=on_b)
        assert cancelled["metadata"]["state"] == "CANCELLED", cancelled
        assert cancelled["error"]["code"] == 1  # google.rpc.Code.CANCELLED
        assert ok(curl(f"{on_a}/v1/{running}", *as_alice)) == cancelled
        upstream.release()

        # Deleted through B: gone on A too.
        for op in (name, running):
            assert ok(curl(f"{on_b}/v1/{op}", "-X", "DELETE", *as_alice)) == {}
            refused(curl(f"{on_a}/v1/{op}", *as_alice), 404, "NOT_FOUND")
        assert ok(curl(f"{on_a}/v1/operations", *as_alice))["operations"] == []
