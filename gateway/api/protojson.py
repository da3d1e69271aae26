"""The one proto3 JSON form of the API's messages outside gRPC: `.proto` field names and every
field present (int64 as strings, enums by name). The HTTP door answers with it, batch result
lines and the payload log hold it, so a result reads the same wherever it is written."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message


def to_dict(message: Message) -> dict[str, Any]:
    """The message as the HTTP door writes it."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
