"""Bounds on what a request body may make the gateway build, checked before or while decoding.

A body within the size limit can still be hostile: JSON nested 100,000 deep, a MessagePack
map announcing two million keys, a form with 40,000 parts or one header line of 30 MB. Each
reader here costs time linear in the body's bytes at C speed (regular expressions, bytes.find,
msgpack's own skip) and Python time bounded by the limits, never by the body: the limits are
checked before anything is built from what they bound.

Everything a request carries besides its image (options, a MessagePack body's metadata, form
fields) shares one budget of bytes; map keys, nesting and form parts have their own bounds.
Refusals are GatewayErrors naming the limit and the setting that raises it: INVALID_INPUT for
malformed or over-nested bodies (400), TOO_LARGE for counts and sizes over a limit (413).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from email import policy
from email.message import Message
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value
from typing import Any

import msgpack

from gateway import errors
from gateway.errors import GatewayError, Kind

# Containers inside containers, for JSON and for MessagePack metadata values. A request needs
# 2 (e.g. {"image": {"b64": ...}}); 32 leaves metadata room and keeps every walk over a value
# far from Python's recursion limit (json and msgpack fail near 1,000).
MAX_DEPTH = 32
# Strings, brackets, braces and commas a JSON body may hold. A request has about 30; 10,000
# take a few milliseconds to scan, and bound the objects json.loads can build from a body.
MAX_JSON_TOKENS = 10_000
# Form parts in one multipart/form-data body: the image and each option field once, with
# room to spare (a detection request has at most 8 parts).
MAX_FORM_PARTS = 16
# One part's header block (Content-Disposition, Content-Type, ...); aiohttp allows 8190
# bytes per header line of the request itself.
MAX_PART_HEADER_BYTES = 8192
# The longest boundary RFC 2046 allows is 70 characters.
MAX_BOUNDARY = 70
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


def _too_deep(what: str) -> GatewayError:
    return errors.invalid_input(
        f"{what} nests containers more than {MAX_DEPTH} deep; a request needs 2 or 3"
    )


# --- JSON -----------------------------------------------------------------------------------

# The next string or structural character.
_JSON_TOKEN = re.compile(rb'["\[\]{},:]')
# Where a request puts its image: {"image": "<base64>"} or {"image": {"b64": "<base64>"}}.
_IMAGE_PATHS = ([b"image"], [b"image", b"b64"])


@dataclass
class JsonRequest:
    data: Any  # the body decoded, the image's string left empty when it was cut out
    image: bytes | memoryview | None  # that string's text (base64; escaped slashes undone)


def json_request(body: bytes, limits: BodyLimits) -> JsonRequest:
    """A JSON request body: its structure checked, the image's string (the one large part of
    a request) cut out, and the rest, within the budget, decoded by json.loads."""
    image: bytes | memoryview | None = None
    span = _scan_json(body)
    rest = len(body) - (span[1] - span[0] if span else 0)
    if rest > limits.max_rest_bytes:
        raise GatewayError(
            Kind.TOO_LARGE,
            f"the JSON body has {rest} bytes besides a base64 string under 'image'; the "
            f"limit is {limits.max_rest_bytes}: send the image there with a few options, or "
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
    if find(body, b"\\", start, end) < 0:
        return memoryview(body)[start:end]
    pieces = []
    while start < end:
        stop = min(start + WINDOW, end)
        if body[stop - 1] == 0x5C and stop < end:  # keep an escape in one piece
            stop += 1
        pieces.append(body[start:stop].replace(b"\\/", b"/"))
        start = stop
    text = b"".join(pieces)
    if find(text, b"\\") >= 0:
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
        token = search(body, position, position + WINDOW)
        if token is None:
            if position + WINDOW >= len(body):
                return image
            position += WINDOW
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
                raise _too_deep("the JSON body")
        elif char == 0x5B:  # [
            kinds.append(char)
            keys.append(None)
            expect_key = False
            if len(kinds) > MAX_DEPTH:
                raise _too_deep("the JSON body")
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
    for start in range(0, len(body), WINDOW):
        escapes += body.count(b"\\", start, start + WINDOW)
        escapes -= body.count(b"\\/", start, start + WINDOW + 1)  # pairs starting here
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
        end = find(body, b'"', end + 1)
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


# --- MessagePack ----------------------------------------------------------------------------

_BIN_HEADER = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # bin 8/16/32: bytes of the length that follows


def _malformed(detail: object) -> GatewayError:
    return errors.invalid_input(f"the body is not valid MessagePack: {detail or 'truncated'}")


# No per-object caps in msgpack itself: the window it is given is the bound.
_UNCAPPED = {f"max_{kind}_len": 2**32 - 1 for kind in ("str", "bin", "array", "map", "ext")}


def _object_end(body: bytes, start: int, budget: int) -> int | None:
    """Where the MessagePack object at `start` ends, if it ends within `budget` bytes (msgpack
    skips it over a copy of at most that many bytes); None when it does not."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(budget, 1), **_UNCAPPED)
    unpacker.feed(body[start : start + budget])
    try:
        unpacker.skip()
    except msgpack.OutOfData:
        if start + budget >= len(body):
            raise _malformed("truncated") from None
        return None
    except msgpack.StackError:
        raise _too_deep("the MessagePack body") from None
    except ValueError as exc:
        raise _malformed(exc) from None
    return start + unpacker.tell()


def _depth(value: Any) -> int:
    """How deep containers nest in an unpacked value (iterative: any depth is safe)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack += [(v, depth + 1) for kv in item.items() for v in kv]
        elif isinstance(item, list | tuple):
            stack += [(v, depth + 1) for v in item]
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def unpack_small(raw: bytes) -> Any:
    """One metadata key or value, as the response gives it back: text as str where it is
    UTF-8, bytes otherwise; map keys of any hashable type."""
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=False)
    except UnicodeDecodeError:
        return msgpack.unpackb(raw, raw=True, strict_map_key=False, use_list=False)


@dataclass
class MsgpackRequest:
    fields: list[tuple[str, Any]]  # the request message's fields, unpacked, in body order
    metadata: list[tuple[bytes, bytes]]  # every other entry's key and value bytes


def msgpack_request(
    body: bytes, field_names: Collection[str], limits: BodyLimits
) -> MsgpackRequest:
    """A MessagePack map: `image` (bin) read straight from the body, other fields and metadata
    each measured within what is left of the budget before they are unpacked."""
    header = msgpack.Unpacker()
    header.feed(body[:5])
    try:
        count = header.read_map_header()
    except (ValueError, msgpack.OutOfData):
        raise errors.invalid_input(
            "the MessagePack body must be a map with an 'image' (bin) entry"
        ) from None
    allowed = limits.max_metadata_keys + len(field_names)
    if count > allowed:
        raise GatewayError(
            Kind.TOO_LARGE,
            f"the MessagePack map has {count} entries; at most {limits.max_metadata_keys} "
            "metadata keys besides the request's fields are accepted (raise "
            "GATEWAY_HTTP_MAX_METADATA_KEYS for more)",
        )
    position, left = header.tell(), limits.max_rest_bytes
    request = MsgpackRequest([], [])
    metadata_keys = 0
    for _ in range(count):
        key, key_end = _key(body, position, left)
        if key_end is None:
            raise limits.budget_error("the MessagePack map's keys and values")
        raw_key = body[position:key_end]
        left -= key_end - position
        if key == "image" and "image" in field_names:
            position = _image(body, key_end, request)
            continue
        value_end = _object_end(body, key_end, left)
        if value_end is None:
            raise limits.budget_error("the MessagePack map's keys and values")
        raw_value = body[key_end:value_end]
        left -= value_end - key_end
        position = value_end
        if isinstance(key, str) and key in field_names:
            request.fields.append((key, _unpack(raw_value)))
            continue
        metadata_keys += 1
        if metadata_keys > limits.max_metadata_keys:
            raise GatewayError(
                Kind.TOO_LARGE,
                f"the MessagePack map has more than {limits.max_metadata_keys} metadata keys "
                "(raise GATEWAY_HTTP_MAX_METADATA_KEYS for more)",
            )
        for raw in (raw_key, raw_value):
            if _type_name(raw[0]) not in ("a map", "an array"):
                continue  # a scalar: nothing nests
            try:
                if _depth(unpack_small(raw)) > MAX_DEPTH:
                    raise _too_deep("a MessagePack metadata entry")
            except (ValueError, TypeError) as exc:
                raise _malformed(f"a metadata entry cannot be read back: {exc}") from None
        request.metadata.append((raw_key, raw_value))
    if position != len(body):
        raise errors.invalid_input(
            f"the MessagePack body has {len(body) - position} bytes after its map; send one map"
        )
    return request


def _key(body: bytes, start: int, budget: int) -> tuple[Any, int | None]:
    """The key at `start` and where it ends (None: not within `budget` bytes). Keys are
    usually short str (fixstr), read without msgpack."""
    if start >= len(body):
        raise _malformed("truncated")
    first = body[start]
    if 0xA0 <= first <= 0xBF:
        end = start + 1 + (first & 0x1F)
        if end > len(body):
            raise _malformed("truncated")
        if end - start > budget:
            return None, None
        try:
            return body[start + 1 : end].decode(), end
        except UnicodeDecodeError:
            return body[start:end], end  # not text: never a field name
    found = _object_end(body, start, budget)
    return (None, None) if found is None else (_unpack(body[start:found]), found)


def _image(body: bytes, start: int, request: MsgpackRequest) -> int:
    """The image, which must be bin: its bytes straight from the body; returns its end."""
    if start >= len(body):
        raise _malformed("truncated")
    first = body[start]
    if first not in _BIN_HEADER:
        if 0xA0 <= first <= 0xBF or 0xD9 <= first <= 0xDB:
            raise errors.invalid_input(
                "image is a MessagePack str; send the image bytes as bin (e.g. Python bytes "
                "with use_bin_type=True, the default)"
            )
        raise errors.invalid_input(f"image must be bin (bytes), got {_type_name(first)}")
    data_start = start + 1 + _BIN_HEADER[first]
    end = data_start + int.from_bytes(body[start + 1 : data_start], "big")
    if data_start > len(body) or end > len(body):
        raise _malformed("truncated")
    request.fields.append(("image", body[data_start:end]))
    return end


def _type_name(first: int) -> str:
    """A MessagePack value's type, from its first byte (the format family)."""
    if first <= 0x7F or first >= 0xE0 or 0xCC <= first <= 0xD3:
        return "an integer"
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):
        return "a map"
    if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):
        return "an array"
    names = {0xC0: "nil", 0xC2: "a boolean", 0xC3: "a boolean", 0xCA: "a float", 0xCB: "a float"}
    return names.get(first, "an ext")


def _unpack(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except UnicodeDecodeError:
        return raw  # not a str: kept as the key's bytes (never a field name)
    except (ValueError, TypeError) as exc:
        raise _malformed(exc) from None


# --- multipart/form-data --------------------------------------------------------------------


@dataclass
class FormPart:
    name: str
    filename: str | None
    content_type: str
    data: bytes


def form_parts(
    content_type: str,
    body: bytes,
    max_parts: int = MAX_FORM_PARTS,
    max_header_bytes: int = MAX_PART_HEADER_BYTES,
) -> list[FormPart]:
    """The parts of a multipart/form-data body (RFC 7578), found with bytes.find: at most
    `max_parts`, each header block at most `max_header_bytes`; transfer encodings base64 and
    quoted-printable decoded."""
    boundary = _boundary(content_type)
    delimiter = b"--" + boundary
    if body.startswith(delimiter):
        position = len(delimiter)
    else:
        found = find(body, b"\r\n" + delimiter)
        if found < 0:
            raise errors.invalid_input(
                "the multipart body does not contain its boundary: check the boundary in "
                "Content-Type"
            )
        position = found + 2 + len(delimiter)
    parts: list[FormPart] = []
    separator = b"\r\n" + delimiter
    while True:
        if body.startswith(b"--", position):
            return parts  # the closing delimiter; anything after it is an epilogue
        line_end = body.find(b"\r\n", position, position + 1024)
        if line_end < 0 or body[position:line_end].strip(b" \t"):
            raise errors.invalid_input(
                "the multipart body is malformed: a boundary line must end after the boundary"
            )
        if len(parts) == max_parts:
            raise GatewayError(
                Kind.TOO_LARGE,
                f"the multipart body has more than {max_parts} parts; send the image and each "
                "option once",
            )
        headers_start = line_end + 2
        headers_end = body.find(b"\r\n\r\n", headers_start - 2, headers_start + max_header_bytes)
        if headers_end < 0:
            raise GatewayError(
                Kind.TOO_LARGE,
                f"a multipart part's headers are longer than {max_header_bytes} bytes or never "
                "end with an empty line",
            )
        data_start = headers_end + 4
        data_end = find(body, separator, data_start)
        if data_end < 0:
            raise errors.invalid_input(
                "the multipart body ends without its closing boundary; the upload may have "
                "been cut short"
            )
        parts.append(_part(body[headers_start : headers_end + 2], body[data_start:data_end]))
        position = data_end + len(separator)


def _boundary(content_type: str) -> bytes:
    header = Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not 0 < len(boundary) <= MAX_BOUNDARY:
        raise errors.invalid_input(
            "Content-Type multipart/form-data needs a boundary parameter of 1 to "
            f"{MAX_BOUNDARY} characters"
        )
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise errors.invalid_input("the multipart boundary must be ASCII") from None


_PART_HEADERS = BytesHeaderParser(policy=policy.HTTP)


def _part(headers: bytes, data: bytes) -> FormPart:
    message = _PART_HEADERS.parsebytes(headers)
    name = message.get_param("name", header="content-disposition")
    if isinstance(name, tuple):  # RFC 2231 (name*=utf-8''...)
        name = collapse_rfc2231_value(name)
    if not isinstance(name, str) or not name:
        raise errors.invalid_input("a multipart part has no name (Content-Disposition)")
    filename = message.get_param("filename", header="content-disposition")
    if isinstance(filename, tuple):
        filename = collapse_rfc2231_value(filename)
    encoding = str(message.get("content-transfer-encoding", "")).strip().lower()
    if encoding == "base64":
        try:
            data = base64.b64decode(data)
        except (binascii.Error, ValueError) as exc:
            raise errors.invalid_input(f"form part {name} is not valid base64: {exc}") from None
    elif encoding == "quoted-printable":
        data = binascii.a2b_qp(data)
    return FormPart(
        name,
        filename if isinstance(filename, str) else None,
        message.get_content_type(),
        data,
    )
