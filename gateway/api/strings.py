"""The caller's strings that reach headers, metadata, logs and the payload log, checked at
every door before any work: the request id (body field or `x-request-id`), the trace headers
passed on to TF Serving, the model's name and label. Each is printable ASCII (space to `~`)
within its length, the rule batch jobs apply to their request ids; anything else is refused
with INVALID_INPUT (gRPC INVALID_ARGUMENT, HTTP 400) naming the field, the limit and where the
string breaks it, without echoing the string back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from gateway import errors

# A UUID4 is 36 characters; 64 is the batch jobs' own limit, so one id fits every door.
MAX_REQUEST_ID = 64
# traceparent is 55 characters, b3 about 70; W3C asks tracestate be propagated up to 512.
MAX_TRACE_HEADER = 512
# Model names and version labels are the operator's config keys; 128 is far above any.
MAX_MODEL_NAME = 128


def problem(value: str, limit: int) -> str | None:
    """What breaks the rule in `value` (None when it keeps it)."""
    if len(value) > limit:
        return f"is {len(value)} characters; the limit is {limit}"
    for index, char in enumerate(value):
        if not " " <= char <= "~":
            return (
                f"holds {_shown(char)} at position {index}: only printable ASCII "
                "(space to '~') is taken"
            )
    return None


def check(field: str, value: str, limit: int, hint: str = "") -> None:
    """INVALID_INPUT when `value`, the caller's `field`, breaks the rule."""
    found = problem(value, limit)
    if found is not None:
        raise errors.invalid_input(f"{field} {found}{hint}")


def request_id(value: str, field: str = "request_id") -> None:
    check(field, value, MAX_REQUEST_ID, " (a UUID4 is usual)")


def trace(headers: Iterable[tuple[str, str]]) -> None:
    for key, value in headers:
        if key == "x-request-id":
            request_id(value, "the x-request-id header")
        else:
            check(f"the {key} header", value, MAX_TRACE_HEADER)


def model(name: str, label: str) -> None:
    check("model.name", name, MAX_MODEL_NAME)
    check("model.label", label, MAX_MODEL_NAME)


def request(message_id: str, name: str, label: str) -> None:
    """A request message's own strings: its request_id and its model's name and label."""
    request_id(message_id)
    model(name, label)


def numbered(name: str, index: int) -> str:
    """A request id for item `index` of `name` (the batch runner's `file:index`) that keeps
    the rule: `name` as is when it does, else a 16-digit hash of it."""
    found = f"{name}:{index}"
    if problem(found, MAX_REQUEST_ID) is None:
        return found
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8)
    return f"{digest.hexdigest()}:{index}"


def echoed(value: str) -> str:
    """`value` when it may go back to the caller as its request id; else ""."""
    return value if problem(value, MAX_REQUEST_ID) is None else ""


def _shown(char: str) -> str:
    code = ord(char)
    return (
        f"the control character U+{code:04X}"
        if code < 0x20 or code == 0x7F
        else (f"the non-ASCII character U+{code:04X}")
    )
