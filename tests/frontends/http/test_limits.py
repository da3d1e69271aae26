"""The HTTP door's body limits (gateway.frontends.http.limits) piece by piece: what each
reader accepts, what it refuses and with which message. The refusals through the real door,
with timings and the event loop, are tests/security/test_hostile_bodies.py."""

from __future__ import annotations

import base64
import json

import msgpack
import pytest

from gateway.errors import GatewayError, Kind
from gateway.frontends.http import limits
from gateway.frontends.http.limits import (
    MAX_DEPTH,
    MAX_FORM_PARTS,
    MAX_JSON_TOKENS,
    BodyLimits,
    base64_image,
    check_json_structure,
    form_parts,
    json_request,
    msgpack_request,
)

LIMITS = BodyLimits(max_rest_bytes=1024, max_metadata_keys=10)
FIELDS = frozenset({"image", "model", "min_score", "max_detections", "request_id"})


def refusal(call: object, *args: object) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


# --- JSON -----------------------------------------------------------------------------------


def test_json_nested_to_the_depth_limit_is_read_and_one_more_is_refused() -> None:
    deep = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    check_json_structure(deep)
    error = refusal(check_json_structure, b"[" + deep + b"]")
    assert error.kind == Kind.INVALID_INPUT and f"more than {MAX_DEPTH} deep" in error.message
    # The body: refused at the 33rd bracket, whatever follows.
    body = b'{"image":"","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error = refusal(json_request, body, LIMITS)
    assert error.kind == Kind.INVALID_INPUT


def test_json_with_too_many_tokens_is_refused_before_decoding() -> None:
    check_json_structure(b"[" + b"1," * (MAX_JSON_TOKENS - 3) + b"1]")
    error = refusal(check_json_structure, b"[" + b"[]," * MAX_JSON_TOKENS + b"[]]")
    assert error.kind == Kind.TOO_LARGE and str(MAX_JSON_TOKENS) in error.message


def test_brackets_and_escaped_quotes_inside_strings_are_not_structure() -> None:
    text = {"image": "AAAA", "request_id": '[[[{{{"\\' * 20 + '\\"}'}
    body = json.dumps(text).encode()
    assert body.count(b"[") > MAX_DEPTH
    assert decoded(body) == (text, "AAAA")
    # An escaped backslash right before the closing quote ends the string.
    body = b'{"image":"AAAA","request_id":"a\\\\"}'
    assert decoded(body) == ({"image": "AAAA", "request_id": "a\\"}, "AAAA")


def decoded(body: bytes) -> tuple[object, str]:
    """json_request's result put back together: the data, and the image's text."""
    read = json_request(body, LIMITS)
    image = bytes(read.image or b"").decode()
    data = read.data
    if read.image is not None:
        if isinstance(data["image"], dict):
            data["image"]["b64"] = image
        else:
            data["image"] = image
    return data, image


@pytest.mark.parametrize(
    "body",
    [
        b'{"image": "QUJD", "min_score": 0.5}',
        b'{"min_score": 0.5, "image": {"b64": "QUJD"}}',
        b'{"model": {"name": "d"}, "image" : "QUJD" }',
    ],
)
def test_the_image_string_is_cut_out_before_json_loads(body: bytes) -> None:
    read = json_request(body, LIMITS)
    assert read.image is not None and bytes(read.image) == b"QUJD"
    assert "QUJD" not in json.dumps(read.data)


@pytest.mark.parametrize(
    "body",
    [
        b'{"x": {"image": "QUJD"}}',  # not at the top
        b'{"image": ["QUJD"]}',  # in an array
        b'{"image": {"b64x": "QUJD"}}',
        b'["image", "QUJD"]',
        b'{"a": "image", "b": "QUJD"}',  # a value, not a key
    ],
)
def test_only_the_image_where_requests_put_it_is_cut_out(body: bytes) -> None:
    assert json_request(body, LIMITS).image is None


def test_escapes_are_bounded_but_escaped_slashes_in_base64_are_free() -> None:
    image = base64.b64encode(bytes(range(256)) * 2000).decode()
    assert image.count("/") > MAX_JSON_TOKENS
    body = json.dumps({"image": image}).replace("/", "\\/").encode()  # as PHP writes it
    read = json_request(body, BodyLimits())
    assert base64_image(read.image or b"", chunk=1024) == bytes(range(256)) * 2000
    error = refusal(check_json_structure, b'["' + b"\\n" * (MAX_JSON_TOKENS + 1) + b'"]')
    assert error.kind == Kind.TOO_LARGE and "escaped characters" in error.message
    error = refusal(json_request, b'{"image": "QUJD\\u0041AAA"}', LIMITS)
    assert error.kind == Kind.INVALID_INPUT and "JSON escapes" in error.message


def test_an_unterminated_string_is_invalid_json() -> None:
    error = refusal(check_json_structure, b'{"image": "' + b'\\"' * 1000)
    assert error.kind == Kind.INVALID_INPUT and "never ends" in error.message


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{", "not valid JSON"),
        (b'{"image": "AAAA", "max_detections": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"image": "AAAA"', "not valid JSON"),
    ],
)
def test_malformed_json_within_the_bounds_is_invalid_input(body: bytes, named: str) -> None:
    error = refusal(json_request, body, BodyLimits())
    assert error.kind == Kind.INVALID_INPUT and named in error.message


def test_everything_besides_the_image_shares_the_budget() -> None:
    image = base64.b64encode(bytes(100_000)).decode()
    for form in (image, {"b64": image}):
        assert json_request(json.dumps({"image": form, "min_score": 0.5}).encode(), LIMITS)
    for body in (
        json.dumps({"image": "AAAA", "request_id": "x" * 2000}).encode(),
        b'{"image": "AAAA", "min_score": 0.' + b"1" * 2000 + b"}",  # any bytes count
        json.dumps({"picture": image}).encode(),  # no image where requests put it
    ):
        error = refusal(json_request, body, LIMITS)
        assert error.kind == Kind.TOO_LARGE
        assert "GATEWAY_HTTP_MAX_METADATA_BYTES" in error.message and "1024" in error.message


@pytest.mark.parametrize("size", [0, 1, 2, 3, 11, 12, 13, 100])
def test_base64_in_pieces_decodes_like_in_one_piece(size: int) -> None:
    data = bytes(range(256)) * 2
    data = data[:size]
    text = base64.b64encode(data).decode()
    assert base64_image(text, chunk=8) == data
    assert base64_image(text.encode(), chunk=4) == data
    assert base64_image(base64.urlsafe_b64encode(data).decode().rstrip("="), chunk=4) == data
    assert base64_image(f" {text}\n", chunk=8) == data


@pytest.mark.parametrize("text", ["AAAA" * 10 + "!!!!", "AAAA=AAA", "AAAAA", "ÀAAA"])
def test_invalid_base64_is_named(text: str) -> None:
    error = refusal(base64_image, text, 8)
    assert error.kind == Kind.INVALID_INPUT and "image is not valid base64" in error.message


def test_windowed_searches_see_what_one_search_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "WINDOW", 8)
    for size in range(30):
        for needle in (b"ab", b"abcde", b"a"):
            data = b"x" * size + needle + b"y" * 5
            assert limits.find(data, needle) == data.find(needle) == size
            assert limits.find(data, needle, 1, size + len(needle) - 1) == -1
    # JSON across windows: tokens, strings with escaped quotes, escaped slashes in the image.
    image = base64.b64encode(bytes(range(200))).decode()
    text = {"request_id": 'a"b\\', "image": {"b64": image}, "n": [1, [2, {"m": "]"}]]}
    body = json.dumps(text).replace("/", "\\/").encode()
    assert decoded(body) == (text, image)
    # A multipart body across windows.
    content_type, body = form(field("image", b"0123456789" * 5), field("min_score", b"0.5"))
    assert [p.data for p in form_parts(content_type, body)] == [b"0123456789" * 5, b"0.5"]


# --- MessagePack ----------------------------------------------------------------------------


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


# --- multipart/form-data --------------------------------------------------------------------


def form(*parts: tuple[bytes, bytes], boundary: bytes = b"XyZ") -> tuple[str, bytes]:
    body = b"".join(
        b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + data + b"\r\n" for head, data in parts
    )
    return f"multipart/form-data; boundary={boundary.decode()}", body + b"--" + boundary + b"--\r\n"


def field(name: str, value: bytes) -> tuple[bytes, bytes]:
    return f'Content-Disposition: form-data; name="{name}"'.encode(), value


def test_parts_come_back_with_their_names_files_types_and_bytes() -> None:
    image = bytes(range(256)) * 40 + b"\r\n--XyY\r\n"
    content_type, body = form(
        (b'Content-Disposition: form-data; name="image"; filename="a.jpg"\r\n'
         b"Content-Type: image/jpeg", image),
        field("min_score", b"0.5"),
        (b"Content-Disposition: form-data; name*=utf-8''r%C3%A9quest_id", b"x"),
        (b'Content-Disposition: form-data; name="b"\r\nContent-Transfer-Encoding: base64',
         base64.b64encode(b"decoded")),
    )  # fmt: skip
    parts = form_parts(content_type, b"a preamble\r\n" + body + b"an epilogue")
    assert [(p.name, p.filename, p.content_type) for p in parts] == [
        ("image", "a.jpg", "image/jpeg"),
        ("min_score", None, "text/plain"),
        ("réquest_id", None, "text/plain"),
        ("b", None, "text/plain"),
    ]
    assert [p.data for p in parts] == [image, b"0.5", b"x", b"decoded"]


def test_more_parts_than_allowed_are_refused_at_the_first_extra_part() -> None:
    content_type, body = form(*(field(f"f{i}", b"v") for i in range(MAX_FORM_PARTS)))
    assert len(form_parts(content_type, body)) == MAX_FORM_PARTS
    content_type, body = form(*(field(f"f{i}", b"v") for i in range(40_000)))
    error = refusal(form_parts, content_type, body)
    assert error.kind == Kind.TOO_LARGE and f"more than {MAX_FORM_PARTS} parts" in error.message


def test_part_headers_are_bounded() -> None:
    long = b"Content-Disposition: form-data; name=x\r\nX-Pad: "
    long += b"a" * limits.MAX_PART_HEADER_BYTES
    content_type, body = form((long, b"v"))
    error = refusal(form_parts, content_type, body)
    assert error.kind == Kind.TOO_LARGE and "headers are longer than 8192 bytes" in error.message
    content_type, body = form((b"Content-Disposition: form-data; name=x", b"v"))
    assert form_parts(content_type, body)[0].data == b"v"


@pytest.mark.parametrize(
    ("content_type", "body", "named"),
    [
        ("multipart/form-data", b"--X\r\n\r\n\r\n--X--", "needs a boundary parameter"),
        ("multipart/form-data; boundary=" + "b" * 71, b"", "needs a boundary parameter"),
        ("multipart/form-data; boundary=X", b"no boundary here", "does not contain its boundary"),
        ("multipart/form-data; boundary=X", b"--X\r\n\r\nabc", "without its closing boundary"),
        ("multipart/form-data; boundary=X", b"--Xjunk\r\n\r\n\r\n--X--", "malformed"),
        ("multipart/form-data; boundary=X", b"--X\r\nX-A: b\r\n\r\nv\r\n--X--", "has no name"),
    ],
)
def test_malformed_forms_are_invalid_input(content_type: str, body: bytes, named: str) -> None:
    error = refusal(form_parts, content_type, body)
    assert error.kind == Kind.INVALID_INPUT and named in error.message
