"""Batch jobs over the HTTP door, with the real curl against a gateway process (`jobs_gateway`,
conftest.py): uploads as multipart, jobs from the proto3 JSON of CreateBatchJobRequest,
operations (get, list, wait, cancel, delete) and results streamed as JSON Lines and resumed from
a line's page_token, and the requests it refuses. One caller's operations on both doors and two
replicas are in test_jobs_http_callers.py; the OpenAPI description and the page's jobs view in
test_jobs_http_page.py."""

from __future__ import annotations

from pathlib import Path

from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.jobs import make_images
from tests.support.jobshttp import curl, ndjson, ok, post_json, refused, wait_done
from tests.support.localserver import LocalServer

IMAGES = 4


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

    request = {
        "upload_id": upload_id,
        "task": "detect",
        "model": {"name": "detector"},
        "options": {"min_score": 0.25},
    }
    op = ok(post_json(jobs_gateway, "/v1/batchJobs", request))
    assert op["name"].startswith("operations/") and op["done"] in (False, True)
    meta = op["metadata"]
    assert meta["@type"] == "type.googleapis.com/vision.v1.BatchJobMetadata"
    assert meta["state"] in ("QUEUED", "RUNNING", "SUCCEEDED")

    done = wait_done(jobs_gateway, op["name"])
    assert done["metadata"]["state"] == "SUCCEEDED", done
    assert done["metadata"]["processed"] == str(IMAGES)
    response = done["response"]
    assert response["@type"] == "type.googleapis.com/vision.v1.BatchJobResult"
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
    jobs_gateway: GatewayProcess, jobs_dataset: Path
) -> None:
    url = jobs_gateway.http_url
    request = {"input_uri": str(jobs_dataset / "allowed"), "model": {"name": "detector"}}
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
    jobs_gateway: GatewayProcess, jobs_dataset: Path, tmp_path: Path
) -> None:
    url = jobs_gateway.http_url
    message = refused(
        post_json(jobs_gateway, "/v1/batchJobs", {"input_uri": "/etc"}), 403, "PERMISSION_DENIED"
    )
    assert "/etc" in message
    message = refused(
        post_json(jobs_gateway, "/v1/batchJobs", {"inputUri": str(jobs_dataset), "shardz": 2}),
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
    padded = {"input_uri": str(jobs_dataset / "allowed"), "request_id": "x" * 70_000}
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
