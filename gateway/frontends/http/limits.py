"""Bounds on what a request body may make the gateway build, checked before or while decoding.

A body within the size limit can still be hostile: JSON nested 100,000 deep, a MessagePack
map announcing two million keys, a form with 40,000 parts or one header line of 30 MB. Each
reader (json_body, msgpack_body, form_body) costs time linear in the body's bytes at C speed
(regular expressions, bytes.find, msgpack's own skip) and Python time bounded by the limits,
never by the body: the limits are checked before anything is built from what they bound.

Everything a request carries besides its image (options, a MessagePack body's metadata, form
fields) shares one budget of bytes; map keys, nesting and form parts have their own bounds.
Refusals are GatewayErrors naming the limit and the setting that raises it: INVALID_INPUT for
malformed or over-nested bodies (400), TOO_LARGE for counts and sizes over a limit (413).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.errors import GatewayError, Kind

# Containers inside containers, for JSON and for MessagePack metadata values. A request needs
# 2 (e.g. {"image": {"b64": ...}}); 32 leaves metadata room and keeps every walk over a value
# far from Python's recursion limit (json and msgpack fail near 1,000).
MAX_DEPTH = 32
# Bodies up to this size are decoded on the event loop (well under a millisecond within the
# limits here); larger ones in a thread, so the loop goes on answering meanwhile. A thread
# holds the GIL for one C call at a time: the longest, json.loads of a string at the JSON
# size limit, is about 0.1 s.
DECODE_INLINE_BYTES = 256 * 1024


# Searches over a body go a window at a time: a search over a few MiB crafted to be slow
# (a short needle made of the body's own bytes) holds the GIL for milliseconds, not seconds,
# and the event loop's thread gets it between windows.
WINDOW = 1024 * 1024


def find(data: bytes, needle: bytes, start: int = 0, end: int | None = None) -> int:
    """data.find(needle, start, end), a window at a time."""
    end = len(data) if end is None else min(end, len(data))
    while start < end:
        found = data.find(needle, start, min(start + WINDOW + len(needle) - 1, end))
        if found >= 0:
            return found
        start += WINDOW
    return -1


@dataclass(frozen=True)
class BodyLimits:
    """The settable limits (gateway.config: http_max_metadata_bytes, http_max_metadata_keys)."""

    # Everything besides the image: options, metadata keys and values, form fields.
    max_rest_bytes: int = 64 * 1024
    # Entries of a MessagePack body's map besides the request's own fields.
    max_metadata_keys: int = 1000

    def budget_error(self, what: str) -> GatewayError:
        return GatewayError(
            Kind.TOO_LARGE,
            f"{what} take more than {self.max_rest_bytes} bytes besides the image; send the "
            "image with a few options and at most that much metadata, or raise "
            "GATEWAY_HTTP_MAX_METADATA_BYTES",
        )


def too_deep(what: str) -> GatewayError:
    return errors.invalid_input(
        f"{what} nests containers more than {MAX_DEPTH} deep; a request needs 2 or 3"
    )
