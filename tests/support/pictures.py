"""Images built in the tests with Pillow and numpy for the imaging tests (tests/imaging): a test
pattern, each format's savers (lossless, lossy, with EXIF), EXIF blocks with an orientation,
hand-made PNG chunks and headers, and what Pillow displays for a file.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from typing import Any

import numpy as np
from PIL import ExifTags, Image, ImageDraw, ImageOps

from gateway.imaging.header import ImageLimits

LIMITS = ImageLimits(max_bytes=20 * 2**20, max_pixels=50_000_000)


PILLOW_DEFAULT_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3


# name -> (Pillow format, save options)
Savers = dict[str, tuple[str, dict[str, Any]]]


LOSSLESS: Savers = {
    "PNG": ("PNG", {}),
    "BMP": ("BMP", {}),
    "TIFF": ("TIFF", {}),
    "TIFF deflate": ("TIFF", {"compression": "tiff_deflate"}),  # decoded through libtiff
    "WebP lossless": ("WEBP", {"lossless": True}),
}


LOSSY: Savers = {
    "JPEG": ("JPEG", {"quality": 95, "subsampling": 0}),
    "WebP": ("WEBP", {"quality": 95}),
}


WITH_EXIF: Savers = {
    "PNG": ("PNG", {}),
    "JPEG": ("JPEG", {"quality": 90}),
    "WebP": ("WEBP", {"lossless": True}),
    "TIFF": ("TIFF", {}),
    "TIFF deflate": ("TIFF", {"compression": "tiff_deflate"}),
}


def pattern(width: int = 48, height: int = 32) -> np.ndarray:
    """Smooth RGB pattern that changes under every flip and rotation."""
    y, x = np.mgrid[0:height, 0:width]
    red = x * 255 // (width - 1)
    green = y * 255 // (height - 1)
    blue = 128 + 2 * (x - y)
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def exif_with(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    return exif


def stored_as_shown(pixels: np.ndarray, fmt: str = "PNG", orientation: int = 1) -> bytes:
    """`pixels` as a viewer shows them, encoded as a PNG or a JPEG (quality 95) whose EXIF
    orientation (1 or 6: shown rotated 90° clockwise) stores them turned so a viewer shows
    that (a PNG carries no orientation)."""
    image = Image.fromarray(pixels)
    if orientation == 6:  # shown rotated 90° clockwise: stored turned the other way
        image = image.transpose(Image.Transpose.ROTATE_90)
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    if fmt == "JPEG":
        image.save(out, format="JPEG", quality=95, exif=exif)
    else:
        image.save(out, format="PNG")
    return out.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def raw_png(width: int, height: int, bit_depth: int, color_type: int, rows: list[bytes]) -> bytes:
    """A PNG written by hand, for layouts Pillow cannot save (16-bit RGB, lying headers)."""
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    scanlines = b"".join(b"\x00" + row for row in rows)  # filter type 0 on every row
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(scanlines))
        + png_chunk(b"IEND", b"")
    )


def png_header_claiming(width: int, height: int) -> bytes:
    """A valid PNG header for a huge RGB image, followed by a few bytes of pixel data."""
    return raw_png(width, height, 8, 2, [b"\x00" * 300])


def pillow_displayed(data: bytes) -> np.ndarray:
    """The image as Pillow's exif_transpose shows it: the reference for orientation."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


def rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., np.newaxis], 3, axis=-1)


PILLOW_DAMAGE_WARNINGS = "ignore::UserWarning:PIL.TiffImagePlugin"  # Pillow's own, expected


# EXIF orientation -> Pillow's transpose (as ImageOps.exif_transpose).
EXIF_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


@functools.cache
def scene(width: int, height: int, seed: int = 0) -> Image.Image:
    """Shading, sensor-like noise and hard-edged shapes: any resampling difference shows."""
    rng = np.random.default_rng(seed)
    y, x = np.ogrid[0:height, 0:width]
    shading = np.empty((height, width, 3), np.int16)
    shading[..., 0] = x * 255 // max(width - 1, 1)
    shading[..., 1] = y * 255 // max(height - 1, 1)
    shading[..., 2] = (x + 2 * y) % 256
    shading += rng.integers(-40, 41, (height, width, 3), dtype=np.int16)
    image = Image.fromarray(np.clip(shading, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        left, top = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = (left, top, left + width // 6, top + height // 5)
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)(box, fill=colour)
    return image


@functools.cache
def encoded(
    width: int,
    height: int,
    fmt: str = "JPEG",
    orientation: int = 1,
    mode: str = "RGB",
    **options: Any,
) -> bytes:
    image = scene(width, height).convert(mode)
    out = io.BytesIO()
    if orientation != 1:
        options["exif"] = exif_with(orientation)
    image.save(out, fmt, **options)
    return out.getvalue()
