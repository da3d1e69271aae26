"""multipart/form-data request bodies within limits: parts found with bytes.find (not the
email parser), a few parts with bounded headers."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from email import policy
from email.message import Message
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value

from gateway import errors
from gateway.errors import GatewayError, Kind
from gateway.frontends.http.limits import find

# Form parts in one multipart/form-data body: the image and each option field once, with
# room to spare (a detection request has at most 8 parts).
MAX_FORM_PARTS = 16
# One part's header block (Content-Disposition, Content-Type, ...); aiohttp allows 8190
# bytes per header line of the request itself.
MAX_PART_HEADER_BYTES = 8192
# The longest boundary RFC 2046 allows is 70 characters.
MAX_BOUNDARY = 70


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
