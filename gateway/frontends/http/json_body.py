"""JSON request bodies within limits: the structure scanned before json.loads builds
anything, the image's base64 string cut out of the body and decoded a MiB at a time."""

from __future__ import annotations

import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from gateway import errors
from gateway.errors import GatewayError, Kind
from gateway.frontends.http import limits
from gateway.frontends.http.limits import MAX_DEPTH, BodyLimits, too_deep

# Strings, brackets, braces and commas a JSON body may hold. A request has about 30; 10,000
# take a few milliseconds to scan, and bound the objects json.loads can build from a body.
MAX_JSON_TOKENS = 10_000

# The next string or structural character.
_JSON_TOKEN = re.compile(rb'["\[\]{},:]')
# Where a request puts its image: {"image": "<base64>"} or {"image": {"b64": "<base64>"}}.
_IMAGE_PATHS = ([b"image"], [b"image", b"b64"])


@dataclass
class JsonRequest:
    data: Any  # the body decoded, the image's string left empty when it was cut out
    image: bytes | memoryview | None  # that string's text (base64; escaped slashes undone)


def json_request(body: bytes, bounds: BodyLimits) -> JsonRequest:
    """A JSON request body: its structure checked, the image's string (the one large part of
    a request) cut out, and the rest, within the budget, decoded by json.loads."""
    image: bytes | memoryview | None = None
    span = _scan_json(body)
    rest = len(body) - (span[1] - span[0] if span else 0)
    if rest > bounds.max_rest_bytes:
        raise GatewayError(
            Kind.TOO_LARGE,
            f"the JSON body has {rest} bytes besides a base64 string under 'image'; the "
            f"limit is {bounds.max_rest_bytes}: send the image there with a few options, or "
            "raise GATEWAY_HTTP_MAX_METADATA_BYTES",
        )
    if span is not None:
        start, end = span
        image = _unescape_slashes(body, start, end)
        body = body[:start] + body[end:]
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise errors.invalid_input(f"the body is not valid JSON: {exc}") from None
    return JsonRequest(data, image)


def _unescape_slashes(body: bytes, start: int, end: int) -> bytes | memoryview:
    r"""The image's text between `start` and `end`: a view of the body, or where it holds
    escapes (some encoders write / as \/), a copy with them undone a window at a time."""
    if limits.find(body, b"\\", start, end) < 0:
        return memoryview(body)[start:end]
    pieces = []
    while start < end:
        stop = min(start + limits.WINDOW, end)
        if body[stop - 1] == 0x5C and stop < end:  # keep an escape in one piece
            stop += 1
        pieces.append(body[start:stop].replace(b"\\/", b"/"))
        start = stop
    text = b"".join(pieces)
    if limits.find(text, b"\\") >= 0:
        raise errors.invalid_input(
            "image is not valid base64: it holds JSON escapes (only \\/ stands for a base64 "
            "character)"
        )
    return text


def check_json_structure(body: bytes) -> None:
    """Refuses a JSON text nested over MAX_DEPTH, with over MAX_JSON_TOKENS tokens or escapes,
    or with a string that never ends (see _scan_json)."""
    _scan_json(body)


def _scan_json(body: bytes) -> tuple[int, int] | None:
    """The structure of a JSON text, checked before json.loads builds anything; returns where
    the image's string (its text between the quotes) is, if the body has one where requests
    put it. Not a validator: malformed JSON within the bounds is json.loads' to refuse.

    Tokens are found a window at a time and strings skipped with bytes.find. At most
    MAX_JSON_TOKENS escapes are accepted (not counting the slashes some encoders escape in
    base64 text), which bounds the look back over backslashes before each quote."""
    _check_escapes(body)
    # Per open container: b"{" or b"[", and an object's current key (None for arrays).
    kinds: list[int] = []
    keys: list[bytes | None] = []
    expect_key = False
    image = None
    tokens = position = 0
    search = _JSON_TOKEN.search
    while True:
        token = search(body, position, position + limits.WINDOW)
        if token is None:
            if position + limits.WINDOW >= len(body):
                return image
            position += limits.WINDOW
            continue
        tokens += 1
        if tokens > MAX_JSON_TOKENS:
            raise GatewayError(
                Kind.TOO_LARGE,
                f"the JSON body has more than {MAX_JSON_TOKENS} tokens (strings, brackets, "
                "commas, colons); a request has the image and a few options",
            )
        start = token.start()
        char = body[start]
        position = start + 1
        if char == 0x22:  # a string: skipped whole
            end = _string_end(body, start)
            if expect_key:
                keys[-1] = body[position:end] if end - position <= 8 else None
                expect_key = False
            elif keys in _IMAGE_PATHS:
                image = (position, end)
            position = end + 1
        elif char == 0x7B:  # {
            kinds.append(char)
            keys.append(None)
            expect_key = True
            if len(kinds) > MAX_DEPTH:
                raise too_deep("the JSON body")
        elif char == 0x5B:  # [
            kinds.append(char)
            keys.append(None)
            expect_key = False
            if len(kinds) > MAX_DEPTH:
                raise too_deep("the JSON body")
        elif char in b"]}":
            if kinds:
                kinds.pop()
                keys.pop()
            expect_key = False
        elif char == 0x2C:  # ,
            expect_key = bool(kinds) and kinds[-1] == 0x7B


def _check_escapes(body: bytes) -> None:
    if b"\\" not in body:
        return
    escapes = 0
    for start in range(0, len(body), limits.WINDOW):
        escapes += body.count(b"\\", start, start + limits.WINDOW)
        escapes -= body.count(b"\\/", start, start + limits.WINDOW + 1)  # pairs starting here
        if escapes > MAX_JSON_TOKENS:
            raise GatewayError(
                Kind.TOO_LARGE,
                f"the JSON body has more than {MAX_JSON_TOKENS} escaped characters; a request "
                "needs none (base64 has no characters to escape)",
            )


def _string_end(body: bytes, start: int) -> int:
    """Where the string opened at `start` ends: the next quote after an even number of
    backslashes (escapes are bounded, so is the look back)."""
    end = start
    while True:
        end = limits.find(body, b'"', end + 1)
        if end < 0:
            raise errors.invalid_input(
                f"the body is not valid JSON: the string at byte {start} never ends"
            )
        run = 0
        while body[end - 1 - run] == 0x5C:
            run += 1
        if run % 2 == 0:
            return end


_URLSAFE = bytes.maketrans(b"-_", b"+/")
_SPACE = b" \t\r\n"


def base64_image(text: str | bytes | memoryview, chunk: int = 1024 * 1024) -> bytes:
    """Standard or URL-safe base64, padded or not (as proto3 JSON accepts), strictly, decoded
    a MiB at a time: the event loop's thread gets the GIL between pieces."""
    if isinstance(text, str):
        try:
            data: bytes | memoryview = text.encode("ascii")
        except UnicodeEncodeError:
            raise errors.invalid_input(
                "image is not valid base64: Only base64 data is allowed"
            ) from None
    else:
        data = text
    if len(data) and (data[0] in _SPACE or data[-1] in _SPACE):
        data = bytes(data).strip()
    padding = b"=" * (-len(data) % 4)
    pieces = []
    try:
        for i in range(0, len(data), chunk):
            piece = bytes(data[i : i + chunk]).translate(_URLSAFE)
            if i + chunk >= len(data):
                piece += padding
            pieces.append(binascii.a2b_base64(piece, strict_mode=True))
    except (binascii.Error, ValueError) as exc:
        raise errors.invalid_input(f"image is not valid base64: {exc}") from None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
