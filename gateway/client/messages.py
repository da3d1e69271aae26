"""Request messages for a task's binding, and result messages as plain JSON-ready data."""

from __future__ import annotations

import base64
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from gateway.api.bindings import Binding, model_spec

# Fields a result's dict starts with, in this order; the task's own fields follow.
_LEADING = ("request_id", "model", "image_width", "image_height")
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_STATUS = "google.rpc.Status"


def task_request(
    binding: Binding,
    image: bytes,
    *,
    model: str = "",
    version: int | None = None,
    label: str | None = None,
    request_id: str = "",
    **options: Any,
) -> Any:
    """The binding's request message for one image; `options` are its option fields."""
    return binding.request(image, model_spec(model, version, label), request_id, **options)


def result_dict(result: Any) -> dict[str, Any]:
    """A result message (a task's, or a pipeline's PipelineResult) as plain data: request_id,
    model, image size, then the task's fields (every field present, a message field when set:
    the HTTP door's fields; a map as an object); scores rounded to 4 decimals, normalized
    coordinates to 5; a google.rpc.Status inside (a pipeline step's failed crop) as its code's
    name and message. A result whose `error` is set becomes its request_id and the error."""
    if result.HasField("error"):
        return {"request_id": result.request_id, "error": _status(result.error)}
    fields = result.DESCRIPTOR.fields_by_name
    names = [name for name in _LEADING if name in fields]
    names += [
        field.name for field in result.DESCRIPTOR.fields if field.name not in (*_LEADING, "error")
    ]
    return {
        name: _value(result, fields[name])
        for name in names
        if not fields[name].has_presence or result.HasField(name)
    }


def _status(status: Any) -> dict[str, str]:
    code = _CODE_NAMES.get(status.code, grpc.StatusCode.UNKNOWN.name)
    return {"code": code, "message": status.message}


def _value(message: Message, field: FieldDescriptor) -> Any:
    value = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry = field.message_type.fields_by_name["value"]
        return {key: _single(message, entry, value[key]) for key in sorted(value)}
    if field.is_repeated:
        return [_single(message, field, item) for item in value]
    return _single(message, field, value)


def _single(message: Message, field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if value.DESCRIPTOR.full_name == _STATUS:
            return _status(value)
        # Every field, but a message (or a oneof's member) only when set, as proto3 JSON
        # writes it.
        return {
            inner.name: _value(value, inner)
            for inner in value.DESCRIPTOR.fields
            if not inner.has_presence or value.HasField(inner.name)
        }
    if field.type == FieldDescriptor.TYPE_BYTES:  # base64, as proto3 JSON writes bytes
        return base64.b64encode(value).decode("ascii")
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return round(value, 5 if message.DESCRIPTOR.name.startswith("Normalized") else 4)
    return value
