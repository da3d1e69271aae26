"""multipart/form-data bodies within limits (gateway.frontends.http.form_body): what the
reader accepts, what it refuses and with which message. Through the real door:
tests/security/test_hostile_bodies.py."""

from __future__ import annotations

import base64

import pytest

from gateway.errors import GatewayError, Kind
from gateway.frontends.http import limits
from gateway.frontends.http.form_body import MAX_FORM_PARTS, MAX_PART_HEADER_BYTES, form_parts


def refusal(call: object, *args: object) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


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
    long += b"a" * MAX_PART_HEADER_BYTES
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


def test_a_form_across_windows_reads_as_in_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "WINDOW", 8)
    content_type, body = form(field("image", b"0123456789" * 5), field("min_score", b"0.5"))
    assert [p.data for p in form_parts(content_type, body)] == [b"0123456789" * 5, b"0.5"]
