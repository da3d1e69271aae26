"""Which image format the bytes are: named from their signature (Pillow never guesses among
all its plugins), the sizes Pillow would allocate for GIF and WebP before it reads them, and
Pillow's failures translated into CorruptImage with a message a person can act on."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

from PIL import (
    BmpImagePlugin,
    GifImagePlugin,
    ImageFile,
    JpegImagePlugin,
    PngImagePlugin,
    TiffImagePlugin,
    WebPImagePlugin,
)

from gateway.imaging import pngmeta
from gateway.imaging.errors import CorruptImage, ImageError, UnsupportedImage

# Format name -> (name in messages, Pillow class that parses the header).
FORMATS: dict[str, tuple[str, type[ImageFile.ImageFile]]] = {
    "JPEG": ("JPEG", JpegImagePlugin.JpegImageFile),
    "PNG": ("PNG", PngImagePlugin.PngImageFile),
    "GIF": ("GIF", GifImagePlugin.GifImageFile),
    "BMP": ("BMP", BmpImagePlugin.BmpImageFile),
    "WEBP": ("WebP", WebPImagePlugin.WebPImageFile),
    "TIFF": ("TIFF", TiffImagePlugin.TiffImageFile),
}


SUPPORTED = ", ".join(name for name, _ in FORMATS.values())


# Well-known formats we do not decode, so the caller hears "HEIF" rather than "garbage".
_OTHER_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"ftypavif", 4, "AVIF"),
    (b"ftypavis", 4, "AVIF"),
    (b"ftypheic", 4, "HEIF"),
    (b"ftypheix", 4, "HEIF"),
    (b"ftypmif1", 4, "HEIF"),
    (b"ftypmsf1", 4, "HEIF"),
    (b"\xff\x0a", 0, "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", 0, "JPEG XL"),
    (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"),
    (b"\xff\x4f\xff\x51", 0, "JPEG 2000"),
    (b"8BPS", 0, "PSD"),
    (b"%PDF", 0, "PDF"),
    (b"\x00\x00\x01\x00", 0, "ICO"),
)


def sniff(data: bytes) -> str:
    """Name the format from its signature; we never let Pillow guess among all its plugins."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data.startswith(b"BM"):
        return "BMP"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WEBP"
    if data.startswith(tuple(TiffImagePlugin.PREFIXES)):
        return "TIFF"
    for signature, offset, other in _OTHER_SIGNATURES:
        if data.startswith(signature, offset):
            raise UnsupportedImage(
                f"image format {other} is not supported: "
                f"convert it to one of {SUPPORTED} and send it again"
            )
    raise UnsupportedImage(
        f"image data could not be decoded as any supported format ({SUPPORTED}): "
        "send the encoded bytes of an image file in one of these formats"
    )


def gif_size(data: bytes) -> tuple[int, int]:
    """Logical screen size, grown to cover the first frame, as Pillow computes it."""
    if len(data) < 13:
        raise CorruptImage(corrupt_message("GIF", "header is incomplete"))
    width, height, flags = struct.unpack_from("<HHB", data, 6)
    pos = 13
    if flags & 0x80:  # global colour table
        pos += 3 << ((flags & 7) + 1)
    while pos < len(data):
        block = data[pos]
        if block == 0x2C:  # image descriptor: left, top, width, height
            if pos + 9 > len(data):
                break
            left, top, frame_width, frame_height = struct.unpack_from("<4H", data, pos + 1)
            return max(width, left + frame_width), max(height, top + frame_height)
        if block != 0x21:  # anything but an extension block ends the header
            break
        pos += 2  # introducer and label, then data sub-blocks up to a zero length
        while pos < len(data) and data[pos]:
            pos += data[pos] + 1
        pos += 1
    return width, height


def webp_size(data: bytes) -> tuple[int, int]:
    """Canvas size from the first chunk (VP8, VP8L or VP8X), which the format requires."""
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack_from("<I", data, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return (
            int.from_bytes(data[24:27], "little") + 1,
            int.from_bytes(data[27:30], "little") + 1,
        )
    raise CorruptImage(corrupt_message("WEBP", "header is incomplete or unknown"))


@contextmanager
def translated_errors(fmt: str, data: bytes = b"") -> Iterator[None]:
    """Turn whatever Pillow raises on hostile or broken bytes into a CorruptImage."""
    try:
        yield
    except (ImageError, MemoryError):
        raise
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
        detail = str(exc) or type(exc).__name__
        if fmt == "PNG" and pngmeta.is_metadata_guard(detail):
            raise CorruptImage(pngmeta.metadata_message(data, detail)) from exc
        raise CorruptImage(corrupt_message(fmt, detail)) from exc


def corrupt_message(fmt: str, detail: str) -> str:
    name = FORMATS[fmt][0]
    return (
        f"image data looks like {name} but could not be decoded ({detail[:200]}): "
        "the file may be truncated or damaged; send the complete image file"
    )
