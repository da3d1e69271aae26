"""JSON bodies within limits (gateway.frontends.http.json_body): what the reader accepts,
what it refuses and with which message. Through the real door, with timings and the event
loop: tests/security/test_hostile_bodies.py."""

from __future__ import annotations

import base64
import json

import pytest

from gateway.errors import GatewayError, Kind
from gateway.frontends.http import limits
from gateway.frontends.http.json_body import (
    MAX_JSON_TOKENS,
    base64_image,
    check_json_structure,
    json_request,
)
from gateway.frontends.http.limits import MAX_DEPTH, BodyLimits

LIMITS = BodyLimits(max_rest_bytes=1024, max_metadata_keys=10)


def refusal(call: object, *args: object) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


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


def test_json_across_windows_reads_as_in_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens, strings with escaped quotes and escaped slashes in the image, each spanning
    search windows."""
    monkeypatch.setattr(limits, "WINDOW", 8)
    image = base64.b64encode(bytes(range(200))).decode()
    text = {"request_id": 'a"b\\', "image": {"b64": image}, "n": [1, [2, {"m": "]"}]]}
    body = json.dumps(text).replace("/", "\\/").encode()
    assert decoded(body) == (text, image)
