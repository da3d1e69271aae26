"""MessagePack bodies within limits (gateway.frontends.http.msgpack_body): what the reader
accepts, what it refuses and with which message. Through the real door:
tests/security/test_hostile_bodies.py."""

from __future__ import annotations

import msgpack
import pytest

from gateway.errors import GatewayError, Kind
from gateway.frontends.http.limits import MAX_DEPTH, BodyLimits
from gateway.frontends.http.msgpack_body import msgpack_request

LIMITS = BodyLimits(max_rest_bytes=1024, max_metadata_keys=10)
FIELDS = frozenset({"image", "model", "min_score", "max_detections", "request_id"})


def refusal(call: object, *args: object) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


def test_fields_and_metadata_are_split_with_the_image_read_straight_from_the_body() -> None:
    packer = msgpack.Packer()
    for image in (b"x" * 10, b"y" * 300, b"z" * 70_000):  # bin 8, 16 and 32
        body = packer.pack({"camera": 3, "image": image, "min_score": 0.5, b"\xff": [1, {2: 3}]})
        request = msgpack_request(body, FIELDS, LIMITS)
        assert request.fields == [("image", image), ("min_score", 0.5)]
        assert request.metadata == [
            (packer.pack("camera"), packer.pack(3)),
            (packer.pack(b"\xff"), packer.pack([1, {2: 3}])),
        ]


def test_a_map_announcing_more_keys_than_allowed_is_refused_from_its_header() -> None:
    # Two million keys announced, none sent: nothing is read past the header.
    body = b"\xdf" + (2_000_000).to_bytes(4, "big")
    error = refusal(msgpack_request, body, FIELDS, LIMITS)
    assert error.kind == Kind.TOO_LARGE
    assert "2000000 entries" in error.message and "GATEWAY_HTTP_MAX_METADATA_KEYS" in error.message


def test_metadata_keys_are_counted_even_when_a_field_repeats() -> None:
    body = msgpack.packb({"image": b"x", **{f"k{i}": i for i in range(10)}})
    assert len(msgpack_request(body, FIELDS, LIMITS).metadata) == 10
    body = msgpack.packb({"image": b"x", **{f"k{i}": i for i in range(11)}})
    assert refusal(msgpack_request, body, FIELDS, LIMITS).kind == Kind.TOO_LARGE
    repeated = b"\x8c" + msgpack.packb("image") + msgpack.packb(b"x")
    repeated += b"".join(msgpack.packb("min_score") + msgpack.packb(0.5) for _ in range(11))
    assert msgpack_request(repeated, FIELDS, LIMITS).fields[-1] == ("min_score", 0.5)


@pytest.mark.parametrize(
    "value",
    [[None] * 2000, "s" * 2000, b"b" * 2000, {i: i for i in range(600)}],
    ids=["array", "str", "bin", "map"],
)
def test_a_metadata_value_over_the_budget_is_refused_without_unpacking_it(value: object) -> None:
    body = msgpack.packb({"image": b"x", "meta": value})
    error = refusal(msgpack_request, body, FIELDS, LIMITS)
    assert error.kind == Kind.TOO_LARGE and "1024 bytes besides the image" in error.message


def test_a_key_over_the_budget_is_refused_too() -> None:
    body = msgpack.packb({"image": b"x", "k" * 5000: 1})
    assert refusal(msgpack_request, body, FIELDS, LIMITS).kind == Kind.TOO_LARGE


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_metadata_nested_too_deep_is_refused(depth: int) -> None:
    body = b"\x82" + msgpack.packb("image") + msgpack.packb(b"x") + msgpack.packb("m")
    body += b"\x91" * depth + b"\xc0"
    error = refusal(msgpack_request, body, FIELDS, BodyLimits())
    assert error.kind == Kind.INVALID_INPUT and f"more than {MAX_DEPTH} deep" in error.message
    ok = b"\x82" + msgpack.packb("image") + msgpack.packb(b"x") + msgpack.packb("m")
    assert msgpack_request(ok + b"\x91" * MAX_DEPTH + b"\xc0", FIELDS, BodyLimits()).metadata


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (msgpack.packb({"image": "c3RyaW5n"}), "image is a MessagePack str"),
        (msgpack.packb({"image": [1, 2]}), "image must be bin (bytes), got an array"),
        (msgpack.packb({"image": 7}), "got an integer"),
        (msgpack.packb({"image": None}), "got nil"),
        (msgpack.packb([1, 2]), "must be a map"),
        (b"\xc1", "must be a map"),
        (msgpack.packb({"image": b"x"}) + b"\x01", "1 bytes after its map"),
        (msgpack.packb({"image": b"xyz"})[:-1], "not valid MessagePack"),
        (msgpack.packb({"image": b"x", "m": 1})[:-1], "not valid MessagePack"),
    ],
)
def test_malformed_messagepack_is_invalid_input(body: bytes, named: str) -> None:
    error = refusal(msgpack_request, body, FIELDS, LIMITS)
    assert error.kind == Kind.INVALID_INPUT and named in error.message


def test_metadata_keys_of_any_type_are_kept_unless_they_cannot_be_read_back() -> None:
    # A list or a map as a key of the body's map: kept as metadata.
    for key in (b"\x91\x01", b"\x81\x01\x02"):
        body = b"\x82\xa5image\xc4\x01x" + key + b"\x03"
        assert msgpack_request(body, FIELDS, LIMITS).metadata == [(key, b"\x03")]
    # A map as a key inside a value: no language can hold it as a map key.
    body = b"\x82\xa5image\xc4\x01x\xa1m\x81\x81\x01\x02\x03"
    error = refusal(msgpack_request, body, FIELDS, LIMITS)
    assert error.kind == Kind.INVALID_INPUT and "cannot be read back" in error.message
