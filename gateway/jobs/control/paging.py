"""ListOperations' filter grammar and the page tokens of listings and result reads."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from gateway import errors
from gateway.jobs.spec.records import CANCELLING, QUEUED, RUNNING, STATES, TERMINAL


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


def decode_token(token: str, kind: str, **fields: type) -> dict[str, Any]:
    """The token's fields, each of the type given (a number: int or float); INVALID_ARGUMENT
    for anything this API did not return, never an exception of another kind."""
    try:
        if len(token) > 1024:
            raise ValueError("too long")
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        if not isinstance(data, dict) or data.get("k") != kind:
            raise ValueError(kind)
        for name, wanted in fields.items():
            value = data.get(name)
            allowed = (int, float) if wanted is float else (wanted,)
            if not isinstance(value, allowed) or isinstance(value, bool):
                raise ValueError(name)
            if isinstance(value, int | float) and not 0 <= value < 2**53:
                raise ValueError(name)
        return data
    except (ValueError, binascii.Error, UnicodeError, RecursionError):
        raise errors.invalid_input("page_token is not one this API returned") from None
