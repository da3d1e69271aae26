"""MessagePack request bodies within limits: the map's size read from its header, the image
read straight from the body, every other entry measured within the budget before it is
unpacked."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import msgpack

from gateway import errors
from gateway.errors import GatewayError, Kind
from gateway.frontends.http.limits import MAX_DEPTH, BodyLimits, too_deep

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
        raise too_deep("the MessagePack body") from None
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
    body: bytes, field_names: Collection[str], bounds: BodyLimits
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
    allowed = bounds.max_metadata_keys + len(field_names)
    if count > allowed:
        raise GatewayError(
            Kind.TOO_LARGE,
            f"the MessagePack map has {count} entries; at most {bounds.max_metadata_keys} "
            "metadata keys besides the request's fields are accepted (raise "
            "GATEWAY_HTTP_MAX_METADATA_KEYS for more)",
        )
    position, left = header.tell(), bounds.max_rest_bytes
    request = MsgpackRequest([], [])
    metadata_keys = 0
    for _ in range(count):
        key, key_end = _key(body, position, left)
        if key_end is None:
            raise bounds.budget_error("the MessagePack map's keys and values")
        raw_key = body[position:key_end]
        left -= key_end - position
        if key == "image" and "image" in field_names:
            position = _image(body, key_end, request)
            continue
        value_end = _object_end(body, key_end, left)
        if value_end is None:
            raise bounds.budget_error("the MessagePack map's keys and values")
        raw_value = body[key_end:value_end]
        left -= value_end - key_end
        position = value_end
        if isinstance(key, str) and key in field_names:
            request.fields.append((key, _unpack(raw_value)))
            continue
        metadata_keys += 1
        if metadata_keys > bounds.max_metadata_keys:
            raise GatewayError(
                Kind.TOO_LARGE,
                f"the MessagePack map has more than {bounds.max_metadata_keys} metadata keys "
                "(raise GATEWAY_HTTP_MAX_METADATA_KEYS for more)",
            )
        for raw in (raw_key, raw_value):
            if _type_name(raw[0]) not in ("a map", "an array"):
                continue  # a scalar: nothing nests
            try:
                if _depth(unpack_small(raw)) > MAX_DEPTH:
                    raise too_deep("a MessagePack metadata entry")
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
