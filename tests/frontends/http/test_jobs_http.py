"""Batch jobs over the HTTP door, with the real curl against a gateway process: uploads as
multipart, jobs from the proto3 JSON of CreateBatchJobRequest, operations (get, list, wait,
cancel, delete) and results streamed as JSON Lines and resumed from a line's page_token; the
same operations through gRPC for the same caller, and none of another caller's; two gateway
processes on one job store, each answering for what was created on the other."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from openapi_spec_validator import validate

from gateway.app import build_jobs, built_in_tasks
from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.frontends import api
from gateway.frontends.http import openapi, page
from gateway.frontends.http.server import HttpDoor
from gateway.models import default_registry
from gateway.readiness import Readiness
from gateway.upstream.client import TFServingClient
from tests.support import tools
from tests.support.browser import Page, with_page
from tests.support.certs import Certificates, make_certificates
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.jobs import Client, make_images, ran
from tests.support.localserver import LocalServer

Response = tuple[int, dict[str, str], bytes]
IMAGES = 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("http-jobs-data")
    make_images(root / "allowed", 3)
    return root


@pytest.fixture(scope="module")
def jobs_gateway(
    http_tfs: LocalServer, http_repo: Path, dataset: Path, tmp_path_factory
) -> Iterator[GatewayProcess]:
    args = [
        f"--model-config={http_repo / 'gateway-models.toml'}",
        f"--job-store={tmp_path_factory.mktemp('http-jobs-store')}",
        f"--batch-allowed-input-uris={dataset / 'allowed'}",
        "--batch-checkpoint-seconds=0.2",
        "--batch-allow-anonymous=true",
    ]
    with run_gateway(
        http_tfs.target, args, log_dir=tmp_path_factory.mktemp("http-jobs-logs"), http=True
    ) as gateway:
        yield gateway


def curl(url: str, *args: str) -> Response:
    """One request with the curl binary; (status, headers, body)."""
    binary = tools.binary("curl", tools.CURL_INSTALL)
    run = subprocess.run(
        [binary, "-sS", "-D", "-", "--max-time", "90", *args, url],
        capture_output=True,
        timeout=120,
        check=True,
    )
    head, _, body = run.stdout.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # curl's Expect: 100-continue
        head, _, body = body.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def ok(response: Response) -> Any:
    status, headers, body = response
    assert status == 200, body
    assert headers["content-type"].startswith("application/json"), headers
    return json.loads(body)


def refused(response: Response, status: int, code: str) -> str:
    got, headers, body = response
    assert got == status, body
    assert headers["content-type"].startswith("application/json"), headers
    error = json.loads(body)["error"]
    assert error["code"] == code, error
    return str(error["message"])


def post_json(gateway: GatewayProcess, path: str, body: object, *args: str) -> Response:
    return curl(
        gateway.http_url + path,
        "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", json.dumps(body),
        *args,
    )  # fmt: skip


def wait_done(gateway: GatewayProcess, name: str, *args: str, url: str = "") -> dict[str, Any]:
    """:wait until the operation is done (each call may return early, done false)."""
    for _ in range(20):
        op = ok(curl(f"{url or gateway.http_url}/v1/{name}:wait?timeout=30s", "-X", "POST", *args))
        if op["done"]:
            return dict(op)
    raise AssertionError(f"{name} not done after 20 waits: {op}")


def ndjson(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(b"\n")
    return [json.loads(line) for line in body.decode().splitlines()]


# --- the whole path with curl ---------------------------------------------------------------


def test_upload_create_wait_and_stream_results(jobs_gateway: GatewayProcess, tmp_path) -> None:
    paths = make_images(tmp_path, IMAGES)
    # A browser's file name with a space: kept, with the space as "_".
    spaced = paths[0].with_name("img 00000.jpg")
    paths[0].rename(spaced)
    url = jobs_gateway.http_url
    first = ok(curl(f"{url}/v1/uploads", *(f"-Fimage=@{p}" for p in [spaced, *paths[1:3]])))
    assert first["image_count"] == "3"
    upload_id = first["upload_id"]
    more = ok(curl(f"{url}/v1/uploads", f"-Fupload_id={upload_id}", f"-Fimage=@{paths[3]}"))
    assert (more["upload_id"], more["image_count"]) == (upload_id, str(IMAGES))
    assert int(more["total_bytes"]) == sum(p.stat().st_size for p in [spaced, *paths[1:]])

    request = {"upload_id": upload_id, "task": "TASK_DETECT", "model": {"name": "detector"}}
    op = ok(post_json(jobs_gateway, "/v1/batchJobs", request))
    assert op["name"].startswith("operations/") and op["done"] in (False, True)
    meta = op["metadata"]
    assert meta["@type"] == "type.googleapis.com/detection.v1.BatchJobMetadata"
    assert meta["state"] in ("QUEUED", "RUNNING", "SUCCEEDED")

    done = wait_done(jobs_gateway, op["name"])
    assert done["metadata"]["state"] == "SUCCEEDED", done
    assert done["metadata"]["processed"] == str(IMAGES)
    response = done["response"]
    assert response["@type"] == "type.googleapis.com/detection.v1.BatchJobResult"
    assert response["code_counts"] == {"OK": str(IMAGES)}
    assert "error" not in done

    status, headers, body = curl(f"{url}/v1/{op['name']}/results")
    assert status == 200 and headers["content-type"] == "application/x-ndjson", body
    lines = ndjson(body)
    names = ["img_00000.jpg", *(p.name for p in paths[1:])]
    assert [line["id"] for line in lines] == sorted(names)  # an upload's order: its names
    for line in lines:
        assert line["result"]["@type"] == "type.googleapis.com/detection.v1.DetectionResult"
        assert line["result"]["model"]["name"] == "detector"
        assert line["page_token"]
    # Resumed after the second line: the rest, the same lines.
    token = lines[1]["page_token"]
    status, _, body = curl(f"{url}/v1/{op['name']}/results?page_token={token}")
    assert status == 200 and ndjson(body) == lines[2:]


def test_operations_are_listed_waited_cancelled_and_deleted(
    jobs_gateway: GatewayProcess, dataset: Path
) -> None:
    url = jobs_gateway.http_url
    request = {"input_uri": str(dataset / "allowed"), "model": {"name": "detector"}}
    ops = [ok(post_json(jobs_gateway, "/v1/batchJobs", request)) for _ in range(2)]
    for op in ops:
        assert wait_done(jobs_gateway, op["name"])["metadata"]["state"] == "SUCCEEDED"
    names = {op["name"] for op in ops}

    listed = ok(curl(f"{url}/v1/operations?filter=state%3DSUCCEEDED"))
    assert names <= {o["name"] for o in listed["operations"]}
    # One per page, following next_page_token.
    seen, token = [], ""
    while True:
        page = ok(curl(f"{url}/v1/operations?page_size=1&page_token={token}"))
        assert len(page["operations"]) <= 1
        seen += [o["name"] for o in page["operations"]]
        token = page["next_page_token"]
        if not token:
            break
    assert names <= set(seen) and len(seen) == len(set(seen))

    name = ops[0]["name"]
    assert ok(curl(f"{url}/v1/{name}")) == wait_done(jobs_gateway, name)
    # Cancelling a finished job changes nothing; deleting forgets it.
    assert ok(curl(f"{url}/v1/{name}:cancel", "-X", "POST")) == {}
    assert ok(curl(f"{url}/v1/{name}"))["metadata"]["state"] == "SUCCEEDED"
    assert ok(curl(f"{url}/v1/{name}", "-X", "DELETE")) == {}
    message = refused(curl(f"{url}/v1/{name}"), 404, "NOT_FOUND")
    assert name in message
    refused(curl(f"{url}/v1/{name}/results"), 404, "NOT_FOUND")


def test_a_waiting_job_is_cancelled(http_tfs: LocalServer, http_repo: Path, tmp_path: Path) -> None:
    # --batch-yield-threshold=0 pauses batch work: the job processes nothing until cancelled.
    args = [
        f"--model-config={http_repo / 'gateway-models.toml'}",
        f"--job-store={tmp_path / 'store'}",
        "--batch-yield-threshold=0",
        "--batch-allow-anonymous=true",
    ]
    with run_gateway(http_tfs.target, args, log_dir=tmp_path, http=True) as gateway:
        url = gateway.http_url
        paths = make_images(tmp_path / "images", 3)
        upload = ok(curl(f"{url}/v1/uploads", *(f"-Fimage=@{p}" for p in paths)))
        request = {"upload_id": upload["upload_id"], "model": {"name": "detector"}}
        op = ok(post_json(gateway, "/v1/batchJobs", request))
        assert not op["done"]
        waited = ok(curl(f"{url}/v1/{op['name']}:wait?timeout=0.2s", "-X", "POST"))
        assert waited["metadata"]["state"] in ("QUEUED", "RUNNING") and not waited["done"]
        assert waited["metadata"]["processed"] == "0"
        assert ok(curl(f"{url}/v1/{op['name']}:cancel", "-X", "POST")) == {}
        done = wait_done(gateway, op["name"])
        assert done["metadata"]["state"] == "CANCELLED"
        assert done["error"]["code"] == 1  # google.rpc.Code.CANCELLED
        assert "response" not in done
        # Nothing ran: the results stream is empty, not an error.
        status, headers, body = curl(f"{url}/v1/{op['name']}/results")
        assert (status, headers["content-type"], body) == (200, "application/x-ndjson", b"")


# --- refusals, in the door's error format ---------------------------------------------------


def test_bad_requests_are_refused_with_the_field_named(
    jobs_gateway: GatewayProcess, dataset: Path, tmp_path: Path
) -> None:
    url = jobs_gateway.http_url
    message = refused(
        post_json(jobs_gateway, "/v1/batchJobs", {"input_uri": "/etc"}), 403, "PERMISSION_DENIED"
    )
    assert "/etc" in message
    message = refused(
        post_json(jobs_gateway, "/v1/batchJobs", {"inputUri": str(dataset), "shardz": 2}),
        400,
        "INVALID_ARGUMENT",
    )
    assert "shardz" in message
    status, _, _ = curl(
        f"{url}/v1/batchJobs", "-X", "POST", "-H", "Content-Type: application/json",
        "--data-binary", "{not json",
    )  # fmt: skip
    assert status == 400
    # A request names its images, it does not carry them: past 64 KiB, 413 as other bodies.
    padded = {"input_uri": str(dataset / "allowed"), "request_id": "x" * 70_000}
    message = refused(post_json(jobs_gateway, "/v1/batchJobs", padded), 413, "INVALID_ARGUMENT")
    assert "/v1/uploads" in message
    deep = "[" * 30_000 + "]" * 30_000  # deep, within the size limit
    status, _, body = curl(
        f"{url}/v1/batchJobs", "-X", "POST", "-H", "Content-Type: application/json",
        "--data-binary", deep,
    )  # fmt: skip
    assert status == 400, body
    refused(
        curl(f"{url}/v1/batchJobs", "-X", "POST", "-H", "Content-Type: text/plain", "-d", "x"),
        415,
        "INVALID_ARGUMENT",
    )
    image = make_images(tmp_path, 1)[0]
    message = refused(curl(f"{url}/v1/uploads", f"-Fphoto=@{image}"), 400, "INVALID_ARGUMENT")
    assert "photo" in message
    message = refused(
        curl(f"{url}/v1/uploads", f"-Fimage=@{image}", "-Fupload_id=abc"),
        400,
        "INVALID_ARGUMENT",
    )
    assert "before the image" in message
    refused(curl(f"{url}/v1/uploads", "-Fupload_id=ffff", f"-Fimage=@{image}"), 404, "NOT_FOUND")
    refused(curl(f"{url}/v1/operations/nope:wait?timeout=soon", "-X", "POST"), 400,
            "INVALID_ARGUMENT")  # fmt: skip
    refused(curl(f"{url}/v1/operations?page_size=many"), 400, "INVALID_ARGUMENT")
    refused(curl(f"{url}/v1/operations/nope"), 404, "NOT_FOUND")
    refused(curl(f"{url}/v1/operations/nope", "-X", "PUT"), 405, "UNIMPLEMENTED")


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


# --- the description ------------------------------------------------------------------------


def test_openapi_describes_exactly_the_jobs_routes(tmp_path: Path) -> None:
    async def build() -> tuple[set[tuple[str, str]], dict[str, Any], str]:
        settings = Settings(http_port=0, job_store=str(tmp_path / "store"))
        registry = default_registry("detector")
        client = TFServingClient(settings)
        with ThreadPoolExecutor(1) as executor:
            pipeline = Pipeline(settings, client, registry, executor, built_in_tasks())
            jobs = build_jobs(settings, pipeline, client, api.BUILT_IN)
            readiness = Readiness(client, registry.default_model, 1.0)
            door = HttpDoor(settings, pipeline, api.BUILT_IN, readiness, jobs)
            routes = {
                (route.method, route.resource.canonical)
                for route in door.app.router.routes()
                if route.method != "HEAD" and route.resource is not None
            }
            document = openapi.document(registry, api.BUILT_IN, jobs=True)
            html = page.render(registry, api.BUILT_IN, jobs=True)
        await client.close()
        return routes, document, html

    routes, document, html = asyncio.run(build())
    described = {(m.upper(), path) for path, item in document["paths"].items() for m in item}
    assert routes == described
    jobs_routes = {r for r in routes if "/v1/models" not in r[1] and r[1].startswith("/v1/")}
    assert jobs_routes == {
        ("POST", "/v1/uploads"),
        ("POST", "/v1/batchJobs"),
        ("GET", "/v1/operations"),
        ("GET", "/v1/operations/{id}"),
        ("DELETE", "/v1/operations/{id}"),
        ("POST", "/v1/operations/{id}:cancel"),
        ("POST", "/v1/operations/{id}:wait"),
        ("GET", "/v1/operations/{id}/results"),
    }
    validate(document)  # a valid OpenAPI 3.1 document
    schemas = document["components"]["schemas"]
    for name in ("CreateBatchJobRequest", "Operation", "BatchJobMetadata", "BatchResultLine"):
        assert name in schemas, name
    assert "upload_id" in schemas["CreateBatchJobRequest"]["properties"]
    # The page has the jobs view only when the routes are there.
    assert 'id="jobs"' in html
    assert 'id="jobs"' not in page.render(default_registry("detector"), api.BUILT_IN)


# --- the page's jobs view in a real browser -------------------------------------------------


async def _job_view(page: Page, url: str, files: list[Path], uri: str) -> dict[str, Any]:
    """Opens the page, picks `files` or types `uri` in the jobs view, presses Start and waits
    for the view to settle; returns what it shows (and the results link's download)."""
    await page.send("Page.navigate", url=url)
    deadline = time.monotonic() + 30
    while await page.evaluate("document.body ? document.body.dataset.state : ''") != "idle":
        assert time.monotonic() < deadline, "the page did not load"
        await asyncio.sleep(0.05)
    if files:
        document = await page.send("DOM.getDocument")
        node = await page.send(
            "DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#job-files"
        )
        await page.send(
            "DOM.setFileInputFiles", files=[str(p) for p in files], nodeId=node["nodeId"]
        )
    else:
        await page.evaluate(f"document.getElementById('job-uri').value = {json.dumps(uri)}")
    await page.evaluate("document.getElementById('job-start').click()")
    deadline = time.monotonic() + 120
    while (state := await page.evaluate("document.body.dataset.job || ''")) not in (
        "done",
        "error",
    ):
        assert time.monotonic() < deadline, f"the job view stayed {state!r}"
        await asyncio.sleep(0.1)
    answer = await page.send(
        "Runtime.evaluate",
        returnByValue=True,
        awaitPromise=True,
        expression=(
            "(async () => { const link = document.getElementById('job-results');"
            " const progress = document.getElementById('job-progress');"
            " return {state: document.body.dataset.job,"
            " status: document.getElementById('job-status').textContent,"
            " value: progress.value, max: progress.max, hidden: link.hidden,"
            " download: link.download, href: link.getAttribute('href'),"
            " results: link.hidden ? '' : await (await fetch(link.href)).text()}; })()"
        ),
    )
    return dict(answer["result"]["value"])


@pytest.mark.parametrize("source", ["picked images", "dataset URI"])
def test_page_runs_a_job_and_offers_its_results(
    jobs_gateway: GatewayProcess, browser: str, dataset: Path, tmp_path: Path, source: str
) -> None:
    picked = make_images(tmp_path, 3) if source == "picked images" else []
    uri = str(dataset / "allowed")
    url = f"{jobs_gateway.http_url}/?model=detector"
    found = asyncio.run(with_page(browser, lambda page: _job_view(page, url, picked, uri)))
    assert found["state"] == "done", found["status"]
    assert "SUCCEEDED" in found["status"] and "3 of 3 images" in found["status"]
    assert (found["value"], found["max"]) == (3, 3)
    assert not found["hidden"] and found["download"].endswith(".jsonl")
    assert found["href"].startswith("/v1/operations/") and found["href"].endswith("/results")
    lines = ndjson(found["results"].encode())
    assert [line["id"] for line in lines] == [f"img-{i:05d}.jpg" for i in range(3)]
    assert all(line["result"]["model"]["name"] == "detector" for line in lines)


def test_page_shows_why_a_job_was_refused(jobs_gateway: GatewayProcess, browser: str) -> None:
    url = f"{jobs_gateway.http_url}/?model=detector"
    found = asyncio.run(with_page(browser, lambda page: _job_view(page, url, [], "/etc")))
    assert found["state"] == "error" and found["hidden"]
    assert found["status"].startswith("PERMISSION_DENIED: ") and "/etc" in found["status"]
