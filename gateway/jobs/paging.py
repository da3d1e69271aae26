"""ListOperations' filter grammar and the page tokens of listings and result reads."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from gateway import errors
from gateway.jobs.records import CANCELLING, QUEUED, RUNNING, STATES, TERMINAL


def parse_filter(text: str) -> set[str]:
    """AIP-160 subset: `state = RUNNING`, `metadata.state=QUEUED OR state=RUNNING`,
    `done = true|false`; empty: everything."""
    text = text.strip()
    if not text:
        return set()
    states: set[str] = set()
    for clause in re.split(r"\s+OR\s+", text):
        match = re.fullmatch(r"\s*(metadata\.state|state|done)\s*=\s*\"?(\w+)\"?\s*", clause)
        if not match:
            raise errors.invalid_input(
                f"filter {text!r}: use state=<{'|'.join(STATES)}> (joined with OR) or "
                "done=true|false"
            )
        key, value = match.group(1), match.group(2)
        if key == "done":
            if value.lower() not in ("true", "false"):
                raise errors.invalid_input("done must be true or false")
            done = value.lower() == "true"
            states |= set(TERMINAL) if done else {QUEUED, RUNNING, CANCELLING}
        elif value.upper() in STATES:
            states.add(value.upper())
        else:
            raise errors.invalid_input(f"unknown state {value!r}; one of {STATES}")
    return states


def encode_token(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def decode_token(token: str, kind: str) -> dict[str, Any]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded))
        if not isinstance(data, dict) or data.get("k") != kind:
            raise ValueError(kind)
        return data
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise errors.invalid_input("page_token is not one this API returned") from None
