"""The HTTP door's routes against its OpenAPI description, and the door's footprint rule
(aiohttp imported only when the port is on), without a running TF Serving."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway import policy
from gateway.app import built_in_tasks
from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.frontends.http import openapi
from gateway.frontends.http.server import HttpDoor
from gateway.models import default_registry
from gateway.readiness import Readiness
from gateway.tasks.builtin import BUILT_IN
from gateway.upstream.client import TFServingClient

ROOT = Path(__file__).resolve().parents[3]


def _routes_and_document() -> tuple[set[tuple[str, str]], dict]:
    async def build() -> tuple[set[tuple[str, str]], dict]:
        settings = Settings(http_port=0)
        registry = default_registry("detector", default_task="detection")
        client = TFServingClient(settings)
        with ThreadPoolExecutor(1) as executor:
            door = HttpDoor(
                settings,
                Pipeline(
                    settings,
                    client,
                    registry,
                    executor,
                    built_in_tasks(),
                    policy.build(settings, registry),
                ),
                BUILT_IN,
                Readiness(client, registry.default_model, 1.0),
            )
            routes = {
                (route.method, route.resource.canonical)
                for route in door.app.router.routes()
                if route.method != "HEAD" and route.resource is not None
            }
            document = openapi.document(registry, BUILT_IN)
        await client.close()
        return routes, document

    return asyncio.run(build())


def test_openapi_describes_exactly_the_server_s_routes() -> None:
    routes, document = _routes_and_document()
    described = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    assert routes == described
    # 3 prediction routes per task (latest, version, label), pipelines, /invocations, /ping,
    # 3 status, rollout, spec, page
    assert len(routes) == 3 * len(BUILT_IN) + 9


def test_openapi_parameters_match_the_path_templates() -> None:
    _, document = _routes_and_document()
    for path, item in document["paths"].items():
        for operation in item.values():
            in_path = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            expected = {part[1:-1] for part in path.replace(":", "/").split("/") if part[:1] == "{"}
            assert in_path == expected, path


def test_aiohttp_is_imported_only_when_the_http_port_is_on() -> None:
    code = "import sys, asyncio\nfrom gateway import app\nprint('aiohttp' in sys.modules)\n"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.stdout.strip() == "False", run.stderr


def test_http_settings_from_flags_and_environment() -> None:
    from gateway.config import MIB
    from gateway.flags import parse_settings

    settings = parse_settings(["--http-body-timeout=5"], {"GATEWAY_HTTP_PORT": "8181"})
    assert (settings.http_port, settings.http_body_timeout) == (8181, 5.0)
    assert Settings().http_port == 8080
    assert parse_settings(["--http-port=0"], {}).http_port == 0
    # The body limit lets any image within max-image-bytes through, even base64 in JSON.
    limits = parse_settings(["--max-image-bytes=3145728"], {})
    assert limits.server_max_receive_bytes == 4 * MIB
    assert limits.http_max_body_bytes == 4 * MIB + MIB
    for argv in (["--http-port=50051"], ["--http-port=-1"], ["--http-header-timeout=0"]):
        with pytest.raises(SystemExit) as refused:
            parse_settings(argv, {})
        assert refused.value.code == 2, argv
