"""HTTP request bodies -> the public API's request messages (a binding's request type), by
media type; the body read within its size limit and time.

Bodies: the proto3 JSON of the request message (`image` as base64, or `{"b64": ...}` as in
TF Serving's REST API); a MessagePack map with `image` as bin, the message's fields under
their proto names, and every other key kept as metadata; a raw image; multipart/form-data
with an `image` file part. Query parameters (`min_score`, `max_detections`, `top_k`,
`request_id`, and `model` / `version` / `label` where the path names no model) override the
body. (Responses: gateway.frontends.http.responses.)

Conversion only: values are checked by the pipeline, as for gRPC. What a body may make the
gateway build (nesting, keys, parts, everything besides the image) is bounded while it is
read (gateway.frontends.http.limits; the readers json_body, msgpack_body and form_body).
Every failure here is a GatewayError naming the field (INVALID_INPUT; TOO_LARGE for a body
over a limit), or an HttpError (408 for a body that does not arrive in time).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from gateway import errors
from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.frontends.http import form_body, json_body, limits, msgpack_body
from gateway.frontends.http.status import body_timeout

JSON = "application/json"
MSGPACK = "application/x-msgpack"
MSGPACK_TYPES = frozenset({MSGPACK, "application/msgpack"})
MULTIPART = "multipart/form-data"
RAW_TYPES = frozenset({"application/x-image", "application/octet-stream"})
# For the 415 answer: what the door accepts, in the order the README lists them.
ACCEPTED = (
    JSON,
    MSGPACK,
    "application/msgpack",
    "image/* (e.g. image/jpeg, image/png)",
    "application/x-image",
    "application/octet-stream",
    MULTIPART,
)

# A binding's request message (image, model, request_id and scalar options; see
# gateway.api.bindings): protobuf classes differ per task.
ApiRequest = Any
# A MessagePack body's metadata: each key's and value's own bytes, in the body's order.
RawMetadata = list[tuple[bytes, bytes]]

_MODEL_KEYS = ("name", "version", "label")
Field = FieldDescriptor


class BodyFormat:
    """Which decoder a Content-Type selects."""

    JSON = "json"
    MSGPACK = "msgpack"
    RAW = "raw"
    MULTIPART = "multipart"


def body_kind(media_type: str) -> str | None:
    """The decoder for a media type (lower case, no parameters); None when unsupported."""
    if media_type == JSON:
        return BodyFormat.JSON
    if media_type in MSGPACK_TYPES:
        return BodyFormat.MSGPACK
    if media_type.startswith("image/") or media_type in RAW_TYPES:
        return BodyFormat.RAW
    if media_type == MULTIPART:
        return BodyFormat.MULTIPART
    return None


@dataclass
class Decoded:
    message: ApiRequest
    # Only MessagePack bodies carry metadata; None otherwise.
    metadata: RawMetadata | None = None


def option_names(message: ApiRequest) -> tuple[str, ...]:
    """The request message's scalar options (min_score, max_detections / top_k, request_id)."""
    return tuple(
        field.name
        for field in message.DESCRIPTOR.fields
        if field.name not in ("image", "model") and field.type != Field.TYPE_MESSAGE
    )


# --- request bodies -------------------------------------------------------------------------


def decode_json(body: bytes, message: ApiRequest, bounds: limits.BodyLimits) -> Decoded:
    read = json_body.json_request(body, bounds)
    data = read.data
    if not isinstance(data, dict):
        raise errors.invalid_input(
            f"the JSON body must be an object with an 'image' field, got {_json_type(data)}"
        )
    if "image" not in data:
        raise errors.invalid_input(
            "the JSON body has no 'image' field: send the encoded image as base64, "
            'e.g. {"image": "<base64>"} or {"image": {"b64": "<base64>"}}'
        )
    image = data.pop("image")
    if isinstance(image, dict):
        if set(image) != {"b64"}:
            raise errors.invalid_input(
                'image must be a base64 string or {"b64": "<base64>"}, got an object with '
                f"keys {sorted(image)}"
            )
        image = image["b64"]
    if not isinstance(image, str):
        raise errors.invalid_input(
            f'image must be a base64 string or {{"b64": "<base64>"}}, got {_json_type(image)}'
        )
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        raise errors.invalid_input(f"invalid JSON request: {exc}") from None
    message.image = json_body.base64_image(image if read.image is None else read.image)
    return Decoded(message)


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return "null" if value is None else "a number"


def decode_msgpack(body: bytes, message: ApiRequest, bounds: limits.BodyLimits) -> Decoded:
    fields = {f.name: f for f in message.DESCRIPTOR.fields}
    read = msgpack_body.msgpack_request(body, fields.keys(), bounds)
    for name, value in read.fields:
        _set_field(message, fields[name], value)
    if not any(name == "image" for name, _ in read.fields):
        raise errors.invalid_input(
            "the MessagePack map has no 'image' entry: put the encoded image under 'image' as bin"
        )
    return Decoded(message, read.metadata)


def _set_field(message: Any, field: FieldDescriptor, value: Any) -> None:
    """One MessagePack value into a message field, with the checks JSON parsing does."""
    name = field.name
    if field.type == Field.TYPE_BYTES:
        if isinstance(value, str):
            raise errors.invalid_input(
                f"{name} is a MessagePack str; send the image bytes as bin (e.g. Python bytes "
                "with use_bin_type=True, the default)"
            )
        if not isinstance(value, bytes):
            raise errors.invalid_input(f"{name} must be bin (bytes), got {_msgpack_type(value)}")
        setattr(message, name, value)
    elif field.type == Field.TYPE_MESSAGE:
        if not isinstance(value, dict):
            raise errors.invalid_input(f"{name} must be a map, got {_msgpack_type(value)}")
        sub = getattr(message, name)
        sub_fields = {field.name: field for field in sub.DESCRIPTOR.fields}
        for sub_key, sub_value in value.items():
            if sub_key not in sub_fields:
                raise errors.invalid_input(
                    f"{name} has no field {sub_key!r} (fields: {', '.join(sub_fields)})"
                )
            _set_scalar(sub, sub_fields[sub_key], sub_value, f"{name}.{sub_key}")
    else:
        _set_scalar(message, field, value, name)


def _set_scalar(message: Any, field: FieldDescriptor, value: Any, where: str) -> None:
    if field.type == Field.TYPE_STRING:
        ok = isinstance(value, str)
    elif field.type in (Field.TYPE_FLOAT, Field.TYPE_DOUBLE):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok:
        wanted = {Field.TYPE_STRING: "a string", Field.TYPE_FLOAT: "a number"}.get(
            field.type, "an integer"
        )
        raise errors.invalid_input(f"{where} must be {wanted}, got {_msgpack_type(value)}")
    try:
        setattr(message, field.name, value)
    except (ValueError, TypeError) as exc:
        raise errors.invalid_input(f"{where}: {exc}") from None


def _msgpack_type(value: object) -> str:
    names = {
        bool: "a boolean",
        bytes: "bin",
        str: "a str",
        dict: "a map",
        list: "an array",
        int: "an integer",
        float: "a float",
    }
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return "nil" if value is None else type(value).__name__


def decode_multipart(
    content_type: str, body: bytes, message: ApiRequest, bounds: limits.BodyLimits
) -> Decoded:
    """multipart/form-data: an `image` file part and option fields."""
    parts = {part.name: part.data for part in form_body.form_parts(content_type, body)}
    image = parts.pop("image", None)
    if image is None:
        raise errors.invalid_input(
            f"the multipart body has no 'image' part (parts: {', '.join(parts) or 'none'}): "
            "add the image file as 'image'"
        )
    if sum(len(name) + len(data) for name, data in parts.items()) > bounds.max_rest_bytes:
        raise bounds.budget_error("the form's fields")
    fields: dict[str, str] = {}
    for name, data in parts.items():
        try:
            fields[name] = data.decode()
        except UnicodeDecodeError:
            raise errors.invalid_input(f"form field {name} is not UTF-8 text") from None
    message.image = image
    allow_model = "model" in message.DESCRIPTOR.fields_by_name  # a pipeline's has none
    apply_query(message, fields, allow_model=allow_model, source="form field")
    return Decoded(message)


def apply_query(
    message: ApiRequest,
    params: Mapping[str, str],
    *,
    allow_model: bool,
    source: str = "query parameter",
) -> None:
    """Options given as text (query string or form fields): the message's scalar options,
    and `model`, `version`, `label` when the path does not name the model."""
    names = option_names(message)
    options = {field.name: field for field in message.DESCRIPTOR.fields if field.name in names}
    model_keys = {"model": "name", "version": "version", "label": "label"} if allow_model else {}
    for key, text in params.items():
        if key in options:
            _set_scalar(message, options[key], _parse_text(options[key], text, key, source), key)
        elif key in model_keys:
            spec = message.model
            field = spec.DESCRIPTOR.fields_by_name[model_keys[key]]
            _set_scalar(spec, field, _parse_text(field, text, key, source), key)
        else:
            known = [*options, *model_keys]
            raise errors.invalid_input(f"unknown {source} {key!r}; known: {', '.join(known)}")


def _parse_text(field: FieldDescriptor, text: str, key: str, source: str) -> Any:
    if field.type == Field.TYPE_STRING:
        return text
    try:
        if field.type in (Field.TYPE_FLOAT, Field.TYPE_DOUBLE):
            value = float(text)
            if math.isfinite(value):
                return value
        else:
            return int(text)
    except ValueError:
        pass
    wanted = "a number" if field.type in (Field.TYPE_FLOAT, Field.TYPE_DOUBLE) else "an integer"
    raise errors.invalid_input(f"{source} {key} must be {wanted}, got {text!r}")


# --- reading and decoding a request's body -------------------------------------------------


def body_limit(settings: Settings, body_format: str) -> int:
    """The largest body of this format: JSON carries the image as base64 (4/3 of its size),
    the other forms carry it as is."""
    if body_format == BodyFormat.JSON:
        return settings.http_max_body_bytes
    return settings.server_max_receive_bytes


def too_large(size: int, limit: int, streamed: bool = False) -> GatewayError:
    what = f"more than {limit}" if streamed else f"{size}"
    return GatewayError(
        Kind.TOO_LARGE,
        f"the request body is {what} bytes; the limit is {limit} bytes (the image limit "
        "GATEWAY_MAX_IMAGE_BYTES plus room for the rest of the request): send a smaller image "
        "or raise GATEWAY_MAX_IMAGE_BYTES",
    )


async def read_body(request: web.Request, body_format: str, settings: Settings) -> bytes:
    """The whole body, refused (413) past the limit before it is buffered: first by
    Content-Length, then while streaming; 408 when it does not arrive in time."""
    limit = body_limit(settings, body_format)
    return await read_bounded(
        request,
        limit,
        settings.http_body_timeout,
        lambda size, streamed: too_large(size, limit, streamed),
    )


async def read_bounded(
    request: web.Request,
    limit: int,
    timeout: float,
    over: Callable[[int, bool], Exception],
) -> bytes:
    """The whole body (every segment until Content-Length or the end of the chunks), at most
    `limit` bytes (`over(size, streamed)` past it, by Content-Length before reading) within
    `timeout` seconds in all (408 after)."""
    length = request.content_length
    if length is not None and length > limit:
        raise over(length, False)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise over(size, True)
                chunks.append(chunk)
    except TimeoutError:
        raise body_timeout(
            f"the request body did not arrive within {timeout:g} s "
            f"({size} bytes received); GATEWAY_HTTP_BODY_TIMEOUT sets the limit"
        ) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def decode(
    body_format: str,
    content_type: str,
    body: bytes,
    message: ApiRequest,
    bounds: limits.BodyLimits,
) -> Decoded:
    """`body` (of `body_format`; `content_type` is the full header) into `message`; bodies
    over limits.DECODE_INLINE_BYTES are decoded in a thread, off the event loop."""
    if body_format == BodyFormat.RAW:
        message.image = body
        return Decoded(message)

    def parse() -> Decoded:
        if body_format == BodyFormat.JSON:
            return decode_json(body, message, bounds)
        if body_format == BodyFormat.MSGPACK:
            return decode_msgpack(body, message, bounds)
        return decode_multipart(content_type, body, message, bounds)

    if len(body) <= limits.DECODE_INLINE_BYTES:
        return parse()
    return await asyncio.get_running_loop().run_in_executor(None, parse)
