"""Batch jobs over the HTTP door with the real curl, for tests/frontends/http/test_jobs_http*.py:
one request and its (status, headers, body), its JSON answer or refusal in the door's error
format, waiting for an operation and reading results as JSON Lines."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.support import tools
from tests.support.gatewayproc import GatewayProcess

Response = tuple[int, dict[str, str], bytes]


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
