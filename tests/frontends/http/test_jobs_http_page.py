"""The batch jobs' description and page on the HTTP door: the OpenAPI document names exactly
the jobs routes the door serves (built in-process), and the page's jobs view runs a job in a
real browser (headless chromium) against `jobs_gateway` (conftest.py)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

from gateway import policy
from gateway.app import build_jobs, built_in_tasks
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline
from gateway.frontends.http import openapi, page
from gateway.frontends.http.server import HttpDoor
from gateway.models import default_registry
from gateway.readiness import Readiness
from gateway.tasks.builtin import BUILT_IN
from gateway.upstream.client import TFServingClient
from tests.support.browser import job_view, with_page
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import make_images
from tests.support.jobshttp import ndjson

# --- the description ------------------------------------------------------------------------


def test_openapi_describes_exactly_the_jobs_routes(tmp_path: Path) -> None:
    async def build() -> tuple[set[tuple[str, str]], dict[str, Any], str]:
        settings = Settings(http_port=0, job_store=str(tmp_path / "store"))
        registry = default_registry("detector", default_task="detection")
        client = TFServingClient(settings)
        with ThreadPoolExecutor(1) as executor:
            pipeline = Pipeline(
                settings,
                client,
                registry,
                executor,
                built_in_tasks(),
                policy.build(settings, registry),
            )
            jobs = build_jobs(settings, Cascades(pipeline, {}), BUILT_IN)
            readiness = Readiness(client, registry.default_model, 1.0)
            door = HttpDoor(settings, pipeline, BUILT_IN, readiness, jobs)
            routes = {
                (route.method, route.resource.canonical)
                for route in door.app.router.routes()
                if route.method != "HEAD" and route.resource is not None
            }
            document = openapi.document(registry, BUILT_IN, jobs=True)
            html = page.render(registry, BUILT_IN, jobs=True)
        await client.close()
        return routes, document, html

    routes, document, html = asyncio.run(build())
    described = {(m.upper(), path) for path, item in document["paths"].items() for m in item}
    assert routes == described
    jobs_routes = {
        r for r in routes if r[1].startswith(("/v1/uploads", "/v1/batchJobs", "/v1/operations"))
    }
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
    create = schemas["CreateBatchJobRequest"]["properties"]
    assert "upload_id" in create
    # The task by its verb; its options as each task's own fields (or an Any).
    assert create["task"]["enum"] == ["", *BUILT_IN.verbs]
    variants = create["options"]["anyOf"]
    assert [set(v.get("properties", ())) for v in variants[:-1]] == [
        set(b.options) for b in BUILT_IN
    ]
    assert variants[-1] == {"$ref": "#/components/schemas/Any"}
    # The page has the jobs view only when the routes are there.
    assert 'id="jobs"' in html
    assert 'id="jobs"' not in page.render(
        default_registry("detector", default_task="detection"), BUILT_IN
    )


# --- the page's jobs view in a real browser -------------------------------------------------


@pytest.mark.parametrize("source", ["picked images", "dataset URI"])
def test_page_runs_a_job_and_offers_its_results(
    jobs_gateway: GatewayProcess, browser: str, jobs_dataset: Path, tmp_path: Path, source: str
) -> None:
    picked = make_images(tmp_path, 3) if source == "picked images" else []
    uri = str(jobs_dataset / "allowed")
    url = f"{jobs_gateway.http_url}/?model=detector"
    found = asyncio.run(with_page(browser, lambda page: job_view(page, url, picked, uri)))
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
    found = asyncio.run(with_page(browser, lambda page: job_view(page, url, [], "/etc")))
    assert found["state"] == "error" and found["hidden"]
    assert found["status"].startswith("PERMISSION_DENIED: ") and "/etc" in found["status"]
