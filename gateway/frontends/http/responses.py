"""HTTP response bodies: a result message as JSON or MessagePack, and the error answer.

Results: the proto3 JSON of the result message with every field present (proto field names),
or the same as a MessagePack map; a MessagePack request's metadata comes back under
`metadata`. Errors: `{"error": {"code": <canonical status name>, "message": ...}}`.

A large answer (a message over INLINE_BYTES: thousands of polygon points, a long vector) is
encoded in a small pool of threads of its own (Encoder), a list element at a time, so the event
loop goes on serving `/ping`, health checks and other callers meanwhile (an 8.5 MB polygon
answer encoded on the loop stalled `/ping` for 20.9 s); small ones are encoded inline, where a
thread hop would cost more than the encoding.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from concurrent.futures import ThreadPoolExecutor
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
# Result messages larger than this (serialized) are encoded off the event loop.
INLINE_BYTES = 64 * 1024
# Threads that encode large answers: at most this many at once, the rest wait their turn.
ENCODE_THREADS = 2
_COMPACT = (",", ":")


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


class Encoder:
    """Result answers: small ones encoded on the event loop, large ones in ENCODE_THREADS
    threads of their own (closed with the door)."""

    def __init__(self, threads: int = ENCODE_THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="http-encode")

    async def result_response(
        self, result: Message, request_id: str, as_msgpack: bool, metadata: RawMetadata | None
    ) -> web.Response:
        encode = to_msgpack if as_msgpack else to_json
        if result.ByteSize() <= INLINE_BYTES:
            body = encode(result, metadata)
        else:
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._pool, encode, result, metadata, True)
        return web.Response(
            body=body,
            content_type=MSGPACK if as_msgpack else JSON,
            headers={REQUEST_ID: request_id},
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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


def to_json(result: Message, metadata: RawMetadata | None = None, chunked: bool = False) -> bytes:
    """The proto3 JSON of a result with every field present (proto field names); `chunked`:
    the same bytes, a list element at a time (a large answer, in a thread)."""
    data = to_dict(result)
    if metadata is not None:
        data["metadata"] = {
            _json_key(unpack_small(key)): _jsonable(unpack_small(value)) for key, value in metadata
        }
    if chunked:
        return _dumps(data).encode()
    return json.dumps(data, separators=_COMPACT, allow_nan=False).encode()


def _dumps(data: dict[str, Any]) -> str:
    """json.dumps(data) (compact, no NaN), a list element at a time: each call holds the GIL
    only that long, so a large answer encoded in a thread lets the event loop run."""
    parts = []
    for key, value in data.items():
        if isinstance(value, list):
            items = ",".join(json.dumps(v, separators=_COMPACT, allow_nan=False) for v in value)
            parts.append(f"{json.dumps(key)}:[{items}]")
        else:
            parts.append(
                f"{json.dumps(key)}:{json.dumps(value, separators=_COMPACT, allow_nan=False)}"
            )
    return "{" + ",".join(parts) + "}"


def to_msgpack(
    result: Message, metadata: RawMetadata | None = None, chunked: bool = False
) -> bytes:
    """The result as a MessagePack map (proto field names, every field, float32 as float 32,
    int64 as integers); the request's metadata entries copied byte for byte. `chunked`: the
    same bytes, a list element at a time (a large answer, in a thread)."""
    data = _native(result)
    packer = msgpack.Packer(use_bin_type=True, use_single_float=True)
    parts: list[bytes] = [packer.pack_map_header(len(data) + (metadata is not None))]
    for key, value in data.items():
        parts.append(packer.pack(key))
        if chunked and isinstance(value, list):  # an element at a time (see _dumps)
            parts.append(packer.pack_array_header(len(value)))
            parts += (packer.pack(item) for item in value)
        else:
            parts.append(packer.pack(value))
    if metadata is not None:
        parts += (packer.pack("metadata"), packer.pack_map_header(len(metadata)))
        for raw_key, raw_value in metadata:
            parts += (raw_key, raw_value)
    return b"".join(parts)


def _native(message: Message) -> dict[str, Any]:
    """Every field of a message as plain values (a map as a map); message fields, and the
    members of a oneof, only when set (as the JSON door writes them)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        if field.type == Field.TYPE_MESSAGE:
            entry_type = field.message_type
            if entry_type is not None and entry_type.GetOptions().map_entry:  # a map
                entry = entry_type.fields_by_name["value"]
                nested = entry.type == Field.TYPE_MESSAGE
                out[field.name] = {k: _native(v) if nested else v for k, v in value.items()}
            elif field.is_repeated:
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
