"""The whole batch flow with the real grpcurl, through server reflection only (no .proto)."""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

from tests.support import tools
from tests.support.jobs import gateway, make_images

DETECT = "detection.v1.DetectRequest"


def grpcurl(target: str, method: str, body: str | None = None) -> str:
    command = [tools.binary("grpcurl", tools.GRPCURL_INSTALL), "-plaintext", "-max-time", "60"]
    if body is not None:
        command += ["-d", "@"]
    done = subprocess.run(
        [*command, target, *([method] if method else ["list"])],
        input=body,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, f"grpcurl {method}: {done.stderr}"
    return done.stdout


# grpcurl prints proto3 JSON with the .proto field names (snake_case), int64 as strings.
def call(target: str, method: str, body: dict[str, Any]) -> Any:
    return json.loads(grpcurl(target, method, json.dumps(body)))


def test_whole_flow_with_grpcurl(tfs, tmp_path, store) -> None:
    images = make_images(tmp_path / "images", 5)
    with gateway(tfs, store, tmp_path) as gw:
        target = gw.target
        services = grpcurl(target, "").split()
        assert {"vision.v1.BatchService", "google.longrunning.Operations"} <= set(services)

        # Upload: a client stream of JSON messages on stdin, bytes in base64.
        stream = "\n".join(
            json.dumps({"name": p.name, "image": base64.b64encode(p.read_bytes()).decode()})
            for p in images
        )
        upload = json.loads(grpcurl(target, "vision.v1.BatchService/UploadImages", stream))
        assert upload["image_count"] == "5"

        op = call(
            target,
            "vision.v1.BatchService/CreateBatchJob",
            {
                "upload_id": upload["upload_id"],
                "task": "detect",
                "options": {"@type": f"type.googleapis.com/{DETECT}", "min_score": 0.1},
                "request_id": "grpcurl-1",
            },
        )
        name = op["name"]
        assert op["metadata"]["@type"] == "type.googleapis.com/vision.v1.BatchJobMetadata"
        assert op["metadata"]["state"] in ("QUEUED", "RUNNING")

        done = op
        while not done.get("done"):
            done = call(
                target,
                "google.longrunning.Operations/WaitOperation",
                {"name": name, "timeout": "30s"},
            )
        assert done["metadata"]["state"] == "SUCCEEDED"
        assert done["metadata"]["processed"] == "5"
        assert done["response"]["@type"] == "type.googleapis.com/vision.v1.BatchJobResult"
        assert done["response"]["code_counts"] == {"OK": "5"}
        same = call(target, "google.longrunning.Operations/GetOperation", {"name": name})
        assert same == done

        raw = grpcurl(target, "vision.v1.BatchService/ReadBatchResults", json.dumps({"name": name}))
        lines = [json.loads(chunk) for chunk in _objects(raw)]
        assert [x["id"] for x in lines] == [p.name for p in images]
        assert lines[0]["result"]["@type"] == "type.googleapis.com/detection.v1.DetectionResult"
        assert lines[0]["result"]["model"]["name"] == "detector"
        rest = grpcurl(
            target,
            "vision.v1.BatchService/ReadBatchResults",
            json.dumps({"name": name, "page_token": lines[2]["page_token"]}),
        )
        assert [json.loads(c)["id"] for c in _objects(rest)] == [p.name for p in images[3:]]

        listed = call(
            target, "google.longrunning.Operations/ListOperations", {"filter": "state=SUCCEEDED"}
        )
        assert [o["name"] for o in listed["operations"]] == [name]
        call(target, "google.longrunning.Operations/DeleteOperation", {"name": name})
        listed = call(target, "google.longrunning.Operations/ListOperations", {})
        assert listed.get("operations", []) == []


def _objects(text: str) -> list[str]:
    """grpcurl prints one pretty JSON object per streamed message."""
    decoder = json.JSONDecoder()
    found, index = [], 0
    text = text.strip()
    while index < len(text):
        obj, end = decoder.raw_decode(text, index)
        found.append(json.dumps(obj))
        index = end
        while index < len(text) and text[index].isspace():
            index += 1
    return found
