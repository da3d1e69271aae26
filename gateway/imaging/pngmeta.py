"""PNG metadata too large to read: which chunk, and a message that says so.

Pillow refuses compressed metadata (ICC profiles, text) that inflates past its per-chunk
limit; the file is then complete, only its metadata is too big, and the caller hears which
chunk to drop rather than "corrupt".
"""

from __future__ import annotations

import struct
import zlib

from PIL import PngImagePlugin

# PNG chunks whose contents are zlib-compressed metadata, and what they hold.
_COMPRESSED_METADATA = {b"iCCP": "ICC colour profile", b"zTXt": "text", b"iTXt": "text"}


def is_metadata_guard(detail: str) -> bool:
    """Pillow's guards against metadata that inflates too far (MAX_TEXT_CHUNK per chunk,
    MAX_TEXT_MEMORY for all text): the file is complete, its metadata is just too big."""
    return detail.startswith(("Decompressed data too large", "Too much memory used in text"))


def metadata_message(data: bytes, detail: str) -> str:
    chunk = _inflating_chunk(data)
    what = _COMPRESSED_METADATA[chunk] if chunk is not None else "metadata"
    where = f" ({chunk.decode()} chunk)" if chunk is not None else ""
    limit = PngImagePlugin.MAX_TEXT_CHUNK
    return (
        f"PNG refused: its {what}{where} decompresses to more than "
        f"{limit / 2**20:g} MiB, the most the gateway reads from one metadata chunk (a guard "
        f"against decompression bombs; Pillow: {detail[:120]}); the pixels were not "
        f"decoded: save the image again without its {what} and send it again"
    )


def _inflating_chunk(data: bytes) -> bytes | None:
    """The first compressed metadata chunk before the pixel data that inflates past
    Pillow's per-chunk limit, or None (reads at most that limit + 1 byte per chunk)."""
    limit = PngImagePlugin.MAX_TEXT_CHUNK
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        body = data[pos + 8 : pos + 8 + length]
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind in _COMPRESSED_METADATA:
            # iCCP: name, NUL, method, zlib data. zTXt: keyword, NUL, method, zlib data.
            # iTXt: keyword, NUL, flag, method, language, NUL, translated keyword, NUL, text.
            start = body.find(b"\0") + 2
            if kind == b"iTXt":
                if body[start - 1 : start] != b"\1":  # not compressed
                    pos += 12 + length
                    continue
                start = body.find(b"\0", body.find(b"\0", start + 1) + 1) + 1
            try:
                inflated = zlib.decompressobj().decompress(body[start:], limit + 1)
            except zlib.error:
                inflated = b""
            if len(inflated) > limit:
                return bytes(kind)
        pos += 12 + length
    return None
