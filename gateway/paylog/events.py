"""One logged image as one CloudEvents 1.0 event: what was asked and what was answered (for a
pipeline, task "pipeline": the whole tree as pipeline.v1's PipelineResult, in one event).

One event per image, holding both the request and the response. KServe's logger sends a
request event and a response event sharing one `id`; CloudEvents requires `source` + `id`
to be unique per event (brokers and sinks may drop the second as a duplicate), and the
gateway knows both halves at once, so one event carries both: half the writes, and a log
line is a whole record to replay.

Context attributes: specversion "1.0", type TYPE, source "/detection-gateway/<host>", id (32
random hex digits, unique per event), time (when the answer was known, RFC 3339 UTC),
datacontenttype "application/json", subject (the model's name). Extensions (lower-case
letters and digits, as the spec asks; KServe's logger adds its own the same way): task,
model, modelversion (the version that answered; absent when none did), caller (the typed
identity), requestid, code (the status name, "OK" for a result) and, when the call had
one, traceparent (the W3C header: the CloudEvents distributed tracing extension). An
attribute whose value would pass MAX_ATTRIBUTE characters as an HTTP header (percent-encoded)
is left out, and named in data's "omitted_attributes": its value is in data already (the
request id, caller and model under "request", the trace id as "trace_id"), so an HTTP
collector never refuses an event for a header's size, and nothing is lost from the record.

`data`:
    {"request": {"method", "request_id", "trace_id", "caller", "model": {"name", "version",
                 "label"} (as asked), "options": {...} (as given, 0: the model's default),
                 "image": {"sha256", "size", "data" (base64, only with images = "full")}},
     "response": {"code", "result" (the typed result as proto JSON, as the HTTP door
                  answers it) or "error": {"code", "message"}, "model": {"name", "version"},
                  "latency_ms"}}
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import socket
import string
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from gateway.api import pipelines
from gateway.api.bindings import Bindings
from gateway.api.protojson import to_dict
from gateway.core.record import trace_id_of
from gateway.domain import ModelRef, Outcome, Request

SPECVERSION = "1.0"
TYPE = "detection.gateway.inference.v1"
CONTENT_TYPE = "application/json"
SOURCE = f"/detection-gateway/{socket.gethostname()}"
# Context attributes besides data; the rest of an event's members are extensions.
CONTEXT = ("specversion", "type", "source", "id", "time", "datacontenttype", "subject")
# The longest attribute value kept as an attribute: far above a SPIFFE ID, a request id or a
# traceparent, and far below the 4-8 KiB a proxy or collector takes for all headers.
MAX_ATTRIBUTE = 256
# Attributes whose values come from the caller or its request (the rest are the gateway's).
_CALLERS = ("subject", "model", "caller", "requestid", "traceparent")


class Record(NamedTuple):
    """What the pipeline knew of one image when it answered; made into an event by the
    payload log's writer, off the request path."""

    task: str
    request: Request
    request_id: str
    model: ModelRef | None  # the model called (None: refused before one was chosen)
    outcome: Outcome | None
    code: str
    message: str  # the error's message ("" for a result)
    full_image: bool
    seconds: float  # the image's time in the gateway
    at: float  # time.time() when the answer was known


def new_id() -> str:
    return f"{random.getrandbits(128):032x}"


def event(record: Record, bindings: Bindings) -> dict[str, Any]:
    """The CloudEvent (structured mode: attributes and data as one JSON object)."""
    request, outcome = record.request, record.outcome
    image: dict[str, Any] = {
        "sha256": hashlib.sha256(request.image).hexdigest(),
        "size": len(request.image),
    }
    if record.full_image:
        image["data"] = base64.b64encode(request.image).decode("ascii")
    asked = record.model or request.model
    if record.task == pipelines.TASK:  # a pipeline's tree: its options are a dict already
        options: dict[str, Any] = dict(request.options)
        names: Iterable[str] = pipelines.OPTIONS
        to_result: Callable[[Outcome], Any] = pipelines.Results(bindings).to_result
    else:
        options = getattr(request.options, "_asdict", dict)()
        binding = bindings.for_task(record.task)
        names, to_result = binding.options, binding.to_result
    trace = dict(request.trace)
    data_request = {
        "method": request.method or record.task,
        "request_id": record.request_id,
        "trace_id": trace_id_of(request.trace) or None,
        "caller": request.caller,
        "model": {"name": asked.name, "version": asked.version, "label": asked.label},
        "options": {name: options[name] for name in names if name in options},
        "image": image,
    }
    response: dict[str, Any] = {"code": record.code}
    if outcome is not None:
        response["result"] = to_dict(to_result(outcome))
        response["model"] = {"name": outcome.model_name, "version": outcome.model_version}
    else:
        response["error"] = {"code": record.code, "message": record.message}
    response["latency_ms"] = round(record.seconds * 1000, 2)
    found: dict[str, Any] = {
        "specversion": SPECVERSION,
        "type": TYPE,
        "source": SOURCE,
        "id": new_id(),
        "time": datetime.fromtimestamp(record.at, UTC).isoformat().replace("+00:00", "Z"),
        "datacontenttype": CONTENT_TYPE,
        "subject": asked.name,
        "task": record.task,
        "model": asked.name,
        "caller": request.caller,
        "requestid": record.request_id,
        "code": record.code,
    }
    if outcome is not None:
        found["modelversion"] = outcome.model_version
    if "traceparent" in trace:
        found["traceparent"] = trace["traceparent"]
    data: dict[str, Any] = {"request": data_request, "response": response}
    omitted = [
        name
        for name in _CALLERS
        if name in found and len(_header_value(str(found[name]))) > MAX_ATTRIBUTE
    ]
    if omitted:
        for name in omitted:
            del found[name]
        data["omitted_attributes"] = omitted
    found["data"] = data
    return found


def structured(event: Mapping[str, Any]) -> bytes:
    """The event in the JSON event format (structured mode), as one line without its newline."""
    return json.dumps(event, separators=(",", ":"), allow_nan=False).encode()


def binary(event: Mapping[str, Any]) -> tuple[dict[str, str], bytes]:
    """The event in HTTP binary mode: ce-* headers for the attributes, data as the body."""
    headers = {"content-type": str(event["datacontenttype"])}
    for name, value in event.items():
        if name not in ("data", "datacontenttype"):
            headers[f"ce-{name}"] = _header_value(str(value))
    return headers, json.dumps(event["data"], separators=(",", ":"), allow_nan=False).encode()


# The HTTP binding: header values are printable ASCII; anything else (and space, '"', '%')
# is percent-encoded as UTF-8.
_SAFE = "".join(c for c in string.printable if " " < c <= "~" and c not in '"%')


def _header_value(value: str) -> str:
    return urllib.parse.quote(value, safe=_SAFE)
