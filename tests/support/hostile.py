"""Hostile and unusual images for the fuzz tests: valid seeds in every supported format and
hand-made headers (decompression bombs, zero sizes, huge metadata)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP")


def pattern(width: int = 40, height: int = 30) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 6 % 256, y * 8 % 256, (x + y) * 3 % 256], axis=2).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int, bit_depth: int = 8, colour: int = 2) -> bytes:
    """A PNG that declares width x height and carries one tiny compressed row: a few hundred
    bytes that would decode to width * height * 3 bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64, 9)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", idat)
        + png_chunk(b"IEND", b"")
    )


def gif_header_only(width: int, height: int) -> bytes:
    """A GIF whose logical screen and only frame are width x height, with no pixel data."""
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00" * 6
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00"
    return screen + frame + b"\x3b"


def seeds() -> dict[str, bytes]:
    """Valid images of every kind the gateway accepts, small, for mutation."""
    image = pattern()
    out = {fmt: encode(image, fmt) for fmt in FORMATS}
    frames = [pattern(), pattern().transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    out["animated GIF"] = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    sixteen = Image.fromarray((np.arange(40 * 30, dtype=np.uint16) * 50).reshape(30, 40))
    out["16-bit PNG"] = encode(sixteen, "PNG")
    exif = Image.Exif()
    exif[0x010E] = "x" * 60_000  # ImageDescription: ~60 KB APP1 segment
    exif[0x0112] = 6
    out["JPEG with 60 KB EXIF"] = encode(image, "JPEG", exif=exif.tobytes())
    out["PNG with 900 KB ICC profile"] = encode(image, "PNG", icc_profile=b"\x00" * 900_000)
    out["JPEG with 2 MB ICC profile"] = encode(image, "JPEG", icc_profile=b"\x07" * 2_000_000)
    return out


def crafted() -> dict[str, bytes]:
    """Headers that lie (huge declared sizes, zero sizes), and a PNG whose ICC chunk inflates
    past Pillow's 1 MB guard for compressed text chunks (a zip bomb in the metadata)."""
    return {
        "PNG with 2 MB ICC profile": encode(pattern(), "PNG", icc_profile=b"\x00" * 2_000_000),
        "PNG declaring 60000x60000": png_header_only(60000, 60000),
        "16-bit PNG declaring 40000x40000": png_header_only(40000, 40000, 16, 2),
        "PNG declaring 0x0": png_header_only(0, 0),
        "PNG declaring 1x0": png_header_only(1, 0),
        "GIF declaring 65535x65535": gif_header_only(65535, 65535),
        "GIF declaring 0x0": gif_header_only(0, 0),
        "empty": b"",
        "one byte": b"\xff",
        "JPEG markers only": b"\xff\xd8\xff\xd9",
    }
