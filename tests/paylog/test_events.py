"""Payload log events against the CloudEvents 1.0 spec's attributes (the `cloudevents`
package is not a dependency: the spec's rules are checked here), written to a file."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.parse
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.paylog import sinks
from gateway.paylog.events import binary
from gateway.paylog.sampling import FULL, Policy, Sampling
from gateway.paylog.writer import PayloadLog
from gateway.tasks.builtin import BUILT_IN
from tests.support.payloads import TRACEPARENT, offer, refused

# CloudEvents 1.0: extension attribute names are lower-case ASCII letters and digits, 20
# characters at most; values are strings, integers or booleans.
EXTENSION = re.compile(r"^[a-z0-9]{1,20}$")
CONTEXT = {"specversion", "type", "source", "id", "time", "datacontenttype", "subject", "data"}


def check_cloudevent(event: dict[str, Any]) -> None:
    for name in ("id", "source", "specversion", "type"):  # REQUIRED, non-empty strings
        assert isinstance(event[name], str) and event[name], name
    assert event["specversion"] == "1.0"
    assert urllib.parse.urlparse(event["source"]).path  # a URI-reference
    assert datetime.fromisoformat(event["time"].replace("Z", "+00:00")).tzinfo is not None
    assert event["time"].endswith("Z")  # RFC 3339 in UTC
    assert event["datacontenttype"] == "application/json"
    for name, value in event.items():
        if name not in CONTEXT:
            assert EXTENSION.match(name), name
            assert isinstance(value, str | int | bool), (name, value)


def test_each_image_is_one_cloudevent_with_its_request_and_answer(tmp_path: Path) -> None:
    path = tmp_path / "payloads.jsonl"
    log = PayloadLog(sinks.FileSink(str(path), 1 << 30), BUILT_IN, 1 << 20)
    log.start()
    offer(log, caller="uri:spiffe://test/sa/a", request_id="ok-1")
    offer(log, caller="uri:spiffe://test/sa/a", request_id="bad-1", image=b"", failure=refused())
    log.close()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(events) == 2
    for event in events:
        check_cloudevent(event)
    answered, failed = events
    assert answered["id"] != failed["id"]
    assert answered["type"] == "detection.gateway.inference.v1"
    assert answered["subject"] == answered["model"] == "detector"
    assert answered["modelversion"] == 2
    assert answered["caller"] == "uri:spiffe://test/sa/a"
    assert answered["requestid"] == "ok-1" and answered["code"] == "OK"
    assert answered["traceparent"] == TRACEPARENT
    request, response = answered["data"]["request"], answered["data"]["response"]
    assert request["method"] == "Detect"
    assert request["trace_id"] == TRACEPARENT.split("-")[1]
    assert request["model"] == {"name": "detector", "version": 2, "label": None}
    assert request["options"] == {"min_score": 0.5, "max_detections": 10}
    # The image as its SHA-256 by default, no data.
    image = b"\xff\xd8 not really a jpeg"
    assert request["image"] == {"sha256": hashlib.sha256(image).hexdigest(), "size": len(image)}
    assert response["model"] == {"name": "detector", "version": 2}
    assert response["result"]["detections"] == [
        {
            "class_id": 3,
            "label": "car",
            "score": 0.875,
            "box": {"x_min": 4, "y_min": 5, "x_max": 20, "y_max": 18},
            "normalized_box": {"x_min": 0.125, "y_min": 0.25, "x_max": 0.625, "y_max": 0.5},
        }
    ]
    assert response["result"]["request_id"] == "ok-1"
    assert response["latency_ms"] == 12.5
    assert failed["code"] == "INVALID_ARGUMENT" and "modelversion" not in failed
    assert failed["data"]["response"]["error"] == {
        "code": "INVALID_ARGUMENT",
        "message": "the image is empty; send the image's bytes",
    }
    assert "result" not in failed["data"]["response"]


def test_images_in_full_are_base64_in_the_data(tmp_path: Path) -> None:
    path = tmp_path / "payloads.jsonl"
    image = bytes(range(256)) * 10
    log = PayloadLog(
        sinks.FileSink(str(path), 1 << 30), BUILT_IN, 1 << 20, Policy(Sampling(1.0, FULL))
    )
    log.start()
    offer(log, image=image)
    log.close()
    (event,) = [json.loads(line) for line in path.read_text().splitlines()]
    logged = event["data"]["request"]["image"]
    assert base64.b64decode(logged["data"]) == image
    assert logged["sha256"] == hashlib.sha256(image).hexdigest()
    assert logged["size"] == len(image)


def test_binary_mode_puts_attributes_in_ce_headers_percent_encoded() -> None:
    event = {
        "specversion": "1.0", "type": "t", "source": "/s", "id": "1",
        "datacontenttype": "application/json", "caller": 'cn:Zoë "x"', "modelversion": 3,
        "traceparent": "00-1\r\nx-evil: 1",
        "data": {"a": 1},
    }  # fmt: skip
    headers, body = binary(event)
    assert headers["content-type"] == "application/json"
    assert headers["ce-specversion"] == "1.0" and headers["ce-id"] == "1"
    assert headers["ce-modelversion"] == "3"
    assert headers["ce-caller"] == "cn:Zo%C3%AB%20%22x%22"
    assert headers["ce-traceparent"] == "00-1%0D%0Ax-evil:%201"
    assert "x-evil" not in headers
    assert json.loads(body) == {"a": 1}
