"""HTTP response bodies: a result message as JSON or MessagePack, and the error answer.

Results: the proto3 JSON of the result message with every field present (proto field names),
or the same as a MessagePack map; a MessagePack request's metadata comes back under
`metadata`. Errors: `{"error": {"code": <canonical status name>, "message": ...}}`.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import msgpack
from aiohttp import web
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from gateway.api.protojson import to_dict
from gateway.frontends.http.bodies import JSON, MSGPACK, MSGPACK_TYPES, RawMetadata
from gateway.frontends.http.msgpack_body import unpack_small

REQUEST_ID = "x-request-id"
Field = FieldDescriptor


def wants_msgpack(request: web.Request, body_is_msgpack: bool) -> bool:
    """MessagePack when Accept names it before JSON; with no preference (no Accept, */*),
    the request's own format."""
    for item in request.headers.get("Accept", "").split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in MSGPACK_TYPES:
            return True
        if media in (JSON, "application/*"):
            return False
    return body_is_msgpack


def result_response(
    result: Message, request_id: str, as_msgpack: bool, metadata: RawMetadata | None
) -> web.Response:
    body = to_msgpack(result, metadata) if as_msgpack else to_json(result, metadata)
    return web.Response(
        body=body,
        content_type=MSGPACK if as_msgpack else JSON,
        headers={REQUEST_ID: request_id},
    )


def error_response(
    status: int,
    code: str,
    message: str,
    request_id: str,
    as_msgpack: bool,
    retry_after: float | None = None,
) -> web.Response:
    """The error answer; with `retry_after` (seconds), a Retry-After header (whole seconds)
    and the exact delay as a google.rpc.RetryInfo in the error's details."""
    response = web.Response(
        status=status,
        body=error_body(code, message, as_msgpack, retry_after),
        content_type=MSGPACK if as_msgpack else JSON,
    )
    if request_id:
        response.headers[REQUEST_ID] = request_id
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return response


def to_json(result: Message, metadata: RawMetadata | None = None) -> bytes:
    """The proto3 JSON of a result with every field present (proto field names)."""
    data = to_dict(result)
    if metadata is not None:
        data["metadata"] = {
            _json_key(unpack_small(key)): _jsonable(unpack_small(value)) for key, value in metadata
        }
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def to_msgpack(result: Message, metadata: RawMetadata | None = None) -> bytes:
    """The result as a MessagePack map (proto field names, every field, float32 as float 32,
    int64 as integers); the request's metadata entries copied byte for byte."""
    data = _native(result)
    packer = msgpack.Packer(use_bin_type=True, use_single_float=True)
    parts: list[bytes] = [packer.pack_map_header(len(data) + (metadata is not None))]
    for key, value in data.items():
        parts += (packer.pack(key), packer.pack(value))
    if metadata is not None:
        parts += (packer.pack("metadata"), packer.pack_map_header(len(metadata)))
        for raw_key, raw_value in metadata:
            parts += (raw_key, raw_value)
    return b"".join(parts)


def _native(message: Message) -> dict[str, Any]:
    """Every field of a message as plain values; message fields only when set."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.type == Field.TYPE_MESSAGE:
            if field.is_repeated:
                out[field.name] = [_native(item) for item in value]
            elif message.HasField(field.name):
                out[field.name] = _native(value)
        elif field.is_repeated:
            out[field.name] = list(value)
        else:
            out[field.name] = value
    return out


def _json_key(key: Any) -> str:
    if isinstance(key, bytes):
        return base64.b64encode(key).decode()
    return key if isinstance(key, str) else json.dumps(_jsonable(key))


def _jsonable(value: Any) -> Any:
    """MessagePack metadata as JSON: bin as {"b64": ...} (TF Serving's REST convention)."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {_json_key(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, msgpack.ExtType):
        return {"ext": value.code, "b64": base64.b64encode(value.data).decode()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def error_body(
    code: str, message: str, as_msgpack: bool, retry_after: float | None = None
) -> bytes:
    error: dict[str, Any] = {"error": {"code": code, "message": message}}
    if retry_after is not None:
        # As google.rpc.Status in JSON (proto3's Duration: seconds with an "s").
        error["error"]["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.RetryInfo",
                "retryDelay": f"{retry_after:.3f}s",
            }
        ]
    if as_msgpack:
        return bytes(msgpack.packb(error, use_bin_type=True))
    return json.dumps(error, separators=(",", ":")).encode()
