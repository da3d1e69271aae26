"""Image inspection and decoding: encoded bytes from a request in, RGB pixels out.

Limits are enforced from the file header before any pixel memory is allocated, and every
Pillow failure is translated into an `ImageError` whose message tells the caller what to do.
No TensorFlow here: `model_can_decode` says when TF Serving can decode the original bytes itself.
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import simplejpeg
from PIL import (
    BmpImagePlugin,
    ExifTags,
    GifImagePlugin,
    Image,
    ImageFile,
    JpegImagePlugin,
    PngImagePlugin,
    TiffImagePlugin,
    WebPImagePlugin,
)

from gateway.imaging import jpeghead

__all__ = [
    "CorruptImage",
    "EmptyImage",
    "ImageError",
    "ImageInfo",
    "ImageLimits",
    "ImageTooLarge",
    "PixelSink",
    "UnsupportedImage",
    "decode_image",
    "decode_stored",
    "encode_png",
    "inspect_image",
    "model_can_decode",
    "orient_box",
]


class ImageError(Exception):
    """An image the gateway cannot use; str(e) tells the caller what to change."""


class EmptyImage(ImageError):
    """The request carried no image bytes."""


class UnsupportedImage(ImageError):
    """The bytes are not in a supported format (or use a variant we cannot convert to RGB)."""


class CorruptImage(ImageError):
    """The bytes look like a supported format but cannot be decoded."""


class ImageTooLarge(ImageError):
    """The image is over a configured limit."""

    limit: Literal["bytes", "pixels"]
    actual: int
    maximum: int

    def __init__(
        self, message: str, *, limit: Literal["bytes", "pixels"], actual: int, maximum: int
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.actual = actual
        self.maximum = maximum


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_pixels <= 0:
            raise ValueError(f"image limits must be positive, got {self}")


@dataclass(frozen=True)
class ImageInfo:
    format: str  # Pillow format name: "JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF"
    mode: str  # Pillow mode as stored ("RGB", "L", "P", "RGBA", "CMYK", "I;16", ...)
    stored_width: int
    stored_height: int
    orientation: int  # EXIF orientation 1..8 (1 when absent or invalid)
    # Bits per sample as stored. Pillow reports a 16-bit RGB(A) PNG as mode "RGB"/"RGBA",
    # so the mode alone cannot tell `model_can_decode` that TF would see different data.
    bit_depth: int = 8

    @property
    def width(self) -> int:
        """Width as a viewer shows the image (after EXIF orientation)."""
        return self.stored_height if self.orientation >= 5 else self.stored_width

    @property
    def height(self) -> int:
        """Height as a viewer shows the image (after EXIF orientation)."""
        return self.stored_width if self.orientation >= 5 else self.stored_height


# Where decode_image writes pixels: gets the image's info, returns a writable uint8 array
# [info.height, info.width, 3] (C-contiguous).
PixelSink = Callable[[ImageInfo], np.ndarray]

# Format name -> (name in messages, Pillow class that parses the header).
_FORMATS: dict[str, tuple[str, type[ImageFile.ImageFile]]] = {
    "JPEG": ("JPEG", JpegImagePlugin.JpegImageFile),
    "PNG": ("PNG", PngImagePlugin.PngImageFile),
    "GIF": ("GIF", GifImagePlugin.GifImageFile),
    "BMP": ("BMP", BmpImagePlugin.BmpImageFile),
    "WEBP": ("WebP", WebPImagePlugin.WebPImageFile),
    "TIFF": ("TIFF", TiffImagePlugin.TiffImageFile),
}
_SUPPORTED = ", ".join(name for name, _ in _FORMATS.values())

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

# Modes Pillow converts to RGB faithfully. "LAB" and "HSV" are left out on purpose:
# Pillow's convert("RGB") copies their channels as if they were RGB.
_CONVERTIBLE_MODES = frozenset(
    {"1", "L", "P", "PA", "LA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "I", "F"}
    | {"I;16", "I;16L", "I;16B", "I;16N"}
)

# The same mapping ImageOps.exif_transpose uses, so our pixels match Pillow's.
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

# PNG: 8-byte signature, then the IHDR chunk (length, type, width, height, bit depth, ...).
_PNG_BIT_DEPTH_OFFSET = 24


def inspect_image(data: bytes, limits: ImageLimits) -> ImageInfo:
    """Read the header only; refuse empty, unsupported, corrupt-header or over-limit images."""
    if data.startswith(b"\xff\xd8\xff") and len(data) <= limits.max_bytes:
        header = jpeghead.read(data)  # plain JPEGs without Pillow (the same answer, faster)
        if header is not None:
            width, height, components, orientation = header
            _check_pixels((width, height), limits)
            return ImageInfo("JPEG", "RGB" if components == 3 else "L", width, height, orientation)
    image, info = _open(data, limits)
    image.close()
    return info


def decode_image(
    data: bytes,
    limits: ImageLimits,
    into: PixelSink | None = None,
    min_size: tuple[int, int] | None = None,
) -> tuple[ImageInfo, np.ndarray]:
    """Decode to a C-contiguous uint8 array [height, width, 3] as a viewer shows it.

    With `min_size` (width, height as shown), a JPEG at least twice that size is decoded
    with libjpeg-turbo's DCT scaling at 1/2, 1/4 or 1/8 (the smallest that stays at least
    `min_size`), so the pixels may be smaller than `info.width` x `info.height`; the caller
    resizes them (gateway.imaging.resize). Cannot be combined with `into`.

    With `into`, the pixels are written into the array `into(info)` returns (shape
    [info.height, info.width, 3], uint8, writable), e.g. a view of the request being built;
    without it they come in a new read-only array. RGB and grayscale JPEGs are decoded with
    libjpeg-turbo (simplejpeg), straight into the destination; everything else, and any JPEG
    libjpeg-turbo warns about, goes through Pillow, whose answer decides.

    CPU-heavy: call it from a worker thread, not the event loop (both decoders release the GIL).
    """
    if into is not None and min_size is not None:
        raise ValueError("decode_image: `into` needs the full size; drop min_size")
    image, info = _open(data, limits)
    with image:
        if info.format == "JPEG" and info.mode in ("RGB", "L"):
            pixels = _decode_jpeg(data, info, into, _dct_denominator(info, min_size))
            if pixels is not None:
                return info, pixels
        with _translated_errors(info.format, data):
            rgb = _to_rgb(image)
            # Pillow's TIFF plugin applies the orientation itself while loading (from the same
            # cached EXIF we read); every other plugin hands us the stored pixels.
            if info.orientation in _TRANSPOSE and info.format != "TIFF":
                rgb = rgb.transpose(_TRANSPOSE[info.orientation])
            # One copy (Pillow stores RGB as 4 bytes per pixel, so packing is unavoidable).
            pixels = np.asarray(rgb)
    if into is None:
        return info, pixels
    out = into(info)
    np.copyto(out, pixels)
    return info, out


def decode_stored(
    data: bytes, limits: ImageLimits, min_size: tuple[int, int]
) -> tuple[ImageInfo, np.ndarray | Image.Image, int]:
    """Decode for resizing to at least `min_size` (width, height as shown): the pixels as
    stored, before EXIF orientation, and the orientation still to apply to them.

    The pixels are decode_image(data, limits, min_size=min_size)'s before it orients them:
    the same decoder, the same DCT scale and the same fallback to Pillow for damaged JPEGs.
    They come as a uint8 array [height, width, 3] from libjpeg-turbo (RGB and grayscale
    JPEGs) or as a loaded Pillow "RGB" image from Pillow (everything else), so the caller
    resizes them without first copying a large image into the other form. The orientation
    is 1 when the decoder has applied it already (Pillow does for TIFF).

    Refuses what decode_image refuses, with the same errors. CPU-heavy like decode_image.
    """
    image, info = _open(data, limits)
    with image:
        if info.format == "JPEG" and info.mode in ("RGB", "L"):
            stored = _decode_jpeg_stored(data, info, _dct_denominator(info, min_size))
            if stored is not None:
                return info, stored, info.orientation
        with _translated_errors(info.format, data):
            rgb = _to_rgb(image)
    # Pillow's TIFF plugin has applied the orientation while loading (see decode_image).
    return info, rgb, 1 if info.format == "TIFF" else info.orientation


def _dct_denominator(info: ImageInfo, min_size: tuple[int, int] | None) -> int:
    """The largest of 1, 2, 4, 8 that keeps the decoded image at least `min_size`."""
    if min_size is None:
        return 1
    width, height = min_size
    for denominator in (8, 4, 2):
        if -(-info.width // denominator) >= width and -(-info.height // denominator) >= height:
            return denominator
    return 1


def _decode_jpeg(
    data: bytes, info: ImageInfo, into: PixelSink | None, denominator: int = 1
) -> np.ndarray | None:
    """libjpeg-turbo's pixels (the same library and settings as Pillow's: accurate integer
    IDCT, smooth chroma upsampling), or None to let Pillow decide about this file. With a
    `denominator` above 1, decoded at that fraction of the size by DCT scaling."""
    if denominator > 1:
        stored = _decode_jpeg_stored(data, info, denominator)
        if stored is None:
            return None
        return np.ascontiguousarray(oriented_view(stored, info.orientation))
    try:
        if info.orientation == 1:
            if into is None:
                pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
                pixels.flags.writeable = False
                return pixels
            out = into(info)
            simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out, strict=True)
            return out
        stored = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError:
        # Truncated or damaged data, or a variant simplejpeg refuses: Pillow tolerates some
        # of these exactly as before (it ignores libjpeg warnings) and reports the rest.
        return None
    shown = oriented_view(stored, info.orientation)
    if into is None:
        return np.ascontiguousarray(shown)
    out = into(info)
    np.copyto(out, shown)
    return out


def _decode_jpeg_stored(data: bytes, info: ImageInfo, denominator: int) -> np.ndarray | None:
    """libjpeg-turbo's pixels as stored (before orientation), at 1/`denominator` of the size
    by DCT scaling, or None to let Pillow decide about this file (see _decode_jpeg)."""
    try:
        if denominator > 1:
            return simplejpeg.decode_jpeg(
                data,
                colorspace="RGB",
                strict=True,
                min_height=-(-info.stored_height // denominator),
                min_width=-(-info.stored_width // denominator),
            )
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError:
        return None


def oriented_view(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """The stored pixels as a viewer shows them (the transposes of _TRANSPOSE), as a view."""
    if orientation >= 5:  # 5..8 swap rows and columns first
        pixels = pixels.transpose(1, 0, 2)
    flip_rows, flip_columns = _FLIPS[orientation]
    return pixels[:: -1 if flip_rows else 1, :: -1 if flip_columns else 1]


# EXIF orientation -> (flip rows, flip columns), applied after the transpose of 5..8.
_FLIPS = {
    1: (False, False),
    2: (False, True),
    3: (True, True),
    4: (True, False),
    5: (False, False),
    6: (False, True),
    7: (True, True),
    8: (True, False),
}


def encode_png(pixels: np.ndarray) -> bytes:
    """Encode uint8 [height, width, 3] pixels as PNG, favouring speed over size (transcoding)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [height, width, 3], got {pixels.dtype} {pixels.shape}")
    out = io.BytesIO()
    # Level 1 is several times faster than the default 6 and the bytes only cross the
    # gateway -> TF Serving hop, where size matters far less than latency.
    Image.fromarray(pixels).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def model_can_decode(info: ImageInfo) -> bool:
    """Whether TF's decode_image(channels=3) gives Pillow's RGB pixels from the original bytes.

    Conservative: only 8-bit L/RGB JPEG and 8-bit L/LA/RGB/RGBA or palette PNG. CMYK/YCCK
    JPEGs, 16-bit and 1/2/4-bit grayscale PNGs, GIF (TF returns every frame), BMP, WebP and
    TIFF are transcoded instead. JPEG pixels can still differ by a few levels: TF and Pillow
    may use different IDCTs.
    """
    if info.format == "JPEG":
        return info.mode in ("L", "RGB") and info.bit_depth == 8
    if info.format == "PNG":
        if info.mode == "P":
            # Palette entries are 8-bit whatever the index depth; optimisers (and Pillow)
            # write small palettes with 1/2/4-bit indices, and libpng expands them the same.
            return info.bit_depth <= 8
        return info.mode in ("L", "LA", "RGB", "RGBA") and info.bit_depth == 8
    return False


def orient_box(
    box: tuple[float, float, float, float], orientation: int
) -> tuple[float, float, float, float]:
    """Map a normalized (ymin, xmin, ymax, xmax) box from the stored image to the displayed one.

    Used when the model saw the stored pixels (TF Serving ignores EXIF) but the caller sees the
    image as a viewer shows it; matches ImageOps.exif_transpose for orientations 1..8.
    """
    ymin, xmin, ymax, xmax = box
    if orientation == 1:
        return ymin, xmin, ymax, xmax
    if orientation == 2:  # mirrored left-right
        return ymin, 1 - xmax, ymax, 1 - xmin
    if orientation == 3:  # rotated 180°
        return 1 - ymax, 1 - xmax, 1 - ymin, 1 - xmin
    if orientation == 4:  # mirrored top-bottom
        return 1 - ymax, xmin, 1 - ymin, xmax
    if orientation == 5:  # transposed: x and y swap
        return xmin, ymin, xmax, ymax
    if orientation == 6:  # displayed rotated 90° clockwise
        return xmin, 1 - ymax, xmax, 1 - ymin
    if orientation == 7:  # transversed: flipped about the anti-diagonal
        return 1 - xmax, 1 - ymax, 1 - xmin, 1 - ymin
    if orientation == 8:  # displayed rotated 90° counter-clockwise
        return 1 - xmax, ymin, 1 - xmin, ymax
    raise ValueError(f"EXIF orientation must be 1..8, got {orientation}")


# --- opening and limits -----------------------------------------------------------------


def _open(data: bytes, limits: ImageLimits) -> tuple[ImageFile.ImageFile, ImageInfo]:
    """Check every limit we can from the header, then let Pillow parse the header only."""
    if not data:
        raise EmptyImage("image is empty: set the request's image to the encoded image bytes")
    if len(data) > limits.max_bytes:
        raise ImageTooLarge(
            f"image is {len(data)} bytes; the limit is {limits.max_bytes} bytes: "
            "send a smaller or more compressed image, or raise GATEWAY_MAX_IMAGE_BYTES",
            limit="bytes",
            actual=len(data),
            maximum=limits.max_bytes,
        )
    fmt = _sniff(data)
    # GIF and WebP headers are read here because Pillow allocates pixel memory while
    # opening them (GIF's first-frame disposal buffer, libwebp's canvas).
    pre_size = _gif_size(data) if fmt == "GIF" else _webp_size(data) if fmt == "WEBP" else None
    if pre_size is not None:
        _check_pixels(pre_size, limits)
    _let_pillow_allow(limits.max_pixels)
    with _translated_errors(fmt, data):
        # The plugin class, not Image.open: Image.open runs Pillow's bomb check (a warning
        # or DecompressionBombError without the size) before we could give our own answer.
        # Constructing the class parses the header only.
        image_class = _FORMATS[fmt][1]
        image = image_class(io.BytesIO(data))
        try:
            info = _describe(fmt, image, data, limits)
        except BaseException:
            image.close()
            raise
    return image, info


def _describe(fmt: str, image: ImageFile.ImageFile, data: bytes, limits: ImageLimits) -> ImageInfo:
    stored_width, stored_height = _stored_size(image)
    _check_pixels((stored_width, stored_height), limits)
    if image.mode not in _CONVERTIBLE_MODES:
        raise UnsupportedImage(
            f"{_FORMATS[fmt][0]} images in mode {image.mode} are not supported: "
            "convert the image to RGB (for example as PNG or JPEG) and send it again"
        )
    return ImageInfo(
        format=fmt,
        mode=image.mode,
        stored_width=stored_width,
        stored_height=stored_height,
        orientation=_orientation(image),
        bit_depth=_bit_depth(image, data),
    )


def _sniff(data: bytes) -> str:
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
                f"convert it to one of {_SUPPORTED} and send it again"
            )
    raise UnsupportedImage(
        f"image data could not be decoded as any supported format ({_SUPPORTED}): "
        "send the encoded bytes of an image file in one of these formats"
    )


def _check_pixels(size: tuple[int, int], limits: ImageLimits) -> None:
    width, height = size
    pixels = width * height
    if pixels > limits.max_pixels:
        raise ImageTooLarge(
            f"image is {width}x{height} pixels ({_amount(pixels)}); the limit is "
            f"{_amount(limits.max_pixels)}: send a smaller image or raise GATEWAY_MAX_PIXELS",
            limit="pixels",
            actual=pixels,
            maximum=limits.max_pixels,
        )


def _amount(pixels: int) -> str:
    # Megapixels read best for photos; tiny test-sized limits would all show as "0.0".
    return f"{pixels / 1e6:.1f} megapixels" if pixels >= 100_000 else f"{pixels} pixels"


_pillow_limit_lock = threading.Lock()


def _let_pillow_allow(max_pixels: int) -> None:
    """Make sure Pillow's own bomb check never refuses (or warns about) what we accept.

    Our limit is checked before Pillow sees the pixels, so Pillow's ceiling only needs to be
    at least ours. It is raised, never lowered (threads may race here, and a lowered value
    could trip another thread's decode), and only when an operator configures a limit above
    Pillow's default of ~89 megapixels.
    """
    with _pillow_limit_lock:
        current = Image.MAX_IMAGE_PIXELS
        if current is not None and current < max_pixels:
            Image.MAX_IMAGE_PIXELS = max_pixels


def _gif_size(data: bytes) -> tuple[int, int]:
    """Logical screen size, grown to cover the first frame, as Pillow computes it."""
    if len(data) < 13:
        raise CorruptImage(_corrupt_message("GIF", "header is incomplete"))
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


def _webp_size(data: bytes) -> tuple[int, int]:
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
    raise CorruptImage(_corrupt_message("WEBP", "header is incomplete or unknown"))


# --- metadata -----------------------------------------------------------------------------


def _stored_size(image: ImageFile.ImageFile) -> tuple[int, int]:
    if isinstance(image, TiffImagePlugin.TiffImageFile):
        # Pillow reports a TIFF's size already turned by its orientation tag (see decode_image).
        tags = image.tag_v2
        return int(tags[TiffImagePlugin.IMAGEWIDTH]), int(tags[TiffImagePlugin.IMAGELENGTH])
    return image.size


def _orientation(image: ImageFile.ImageFile) -> int:
    """EXIF orientation from metadata already parsed with the header; 1 if absent or invalid."""
    try:
        # The base method on purpose: PngImageFile.getexif decodes every pixel to look for
        # an eXIf chunk after the image data. decode_image uses this same value, so
        # inspect_image and decode_image always agree.
        value = Image.Image.getexif(image).get(ExifTags.Base.Orientation, 1)
    except Exception:
        # Viewers ignore unreadable EXIF; a damaged block must not fail a good image.
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _bit_depth(image: ImageFile.ImageFile, data: bytes) -> int:
    if isinstance(image, PngImagePlugin.PngImageFile):
        return data[_PNG_BIT_DEPTH_OFFSET]
    if isinstance(image, TiffImagePlugin.TiffImageFile):
        bits = image.tag_v2.get(TiffImagePlugin.BITSPERSAMPLE, 1)
        return max(bits) if isinstance(bits, tuple) else int(bits)
    if image.mode == "1":
        return 1
    if image.mode.startswith("I;16"):
        return 16
    if image.mode in ("I", "F"):
        return 32
    return 8


# --- pixels -------------------------------------------------------------------------------


def _to_rgb(image: ImageFile.ImageFile) -> Image.Image:
    image.load()
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or image.mode == "I":
        return Image.fromarray(_sixteen_bit_to_eight(np.asarray(image))).convert("RGB")
    # Alpha is dropped by design (like TF's decode_png(channels=3)); leaving the key in
    # makes Pillow warn about palette transparency it would only carry over.
    image.info.pop("transparency", None)
    return image.convert("RGB")


def _sixteen_bit_to_eight(samples: np.ndarray) -> np.ndarray:
    """Keep the high byte, as TF's convert_image_dtype and Pillow's 16-bit RGB PNG reader do.

    Pillow's own convert() clips 16-bit values at 255, which turns most images white.
    Mode "I" (32-bit) is read as 16-bit data, its usual origin, and clipped to that range.
    """
    return (np.clip(samples, 0, 0xFFFF) >> 8).astype(np.uint8)


@contextmanager
def _translated_errors(fmt: str, data: bytes = b"") -> Iterator[None]:
    """Turn whatever Pillow raises on hostile or broken bytes into a CorruptImage."""
    try:
        yield
    except (ImageError, MemoryError):
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
        detail = str(e) or type(e).__name__
        if fmt == "PNG" and _is_png_metadata_guard(detail):
            raise CorruptImage(_png_metadata_message(data, detail)) from e
        raise CorruptImage(_corrupt_message(fmt, detail)) from e


# PNG chunks whose contents are zlib-compressed metadata, and what they hold.
_PNG_COMPRESSED_METADATA = {b"iCCP": "ICC colour profile", b"zTXt": "text", b"iTXt": "text"}


def _is_png_metadata_guard(detail: str) -> bool:
    """Pillow's guards against metadata that inflates too far (MAX_TEXT_CHUNK per chunk,
    MAX_TEXT_MEMORY for all text): the file is complete, its metadata is just too big."""
    return detail.startswith(("Decompressed data too large", "Too much memory used in text"))


def _png_metadata_message(data: bytes, detail: str) -> str:
    chunk = _png_inflating_chunk(data)
    what = _PNG_COMPRESSED_METADATA[chunk] if chunk is not None else "metadata"
    where = f" ({chunk.decode()} chunk)" if chunk is not None else ""
    limit = PngImagePlugin.MAX_TEXT_CHUNK
    return (
        f"PNG refused: its {what}{where} decompresses to more than "
        f"{limit / 2**20:g} MiB, the most the gateway reads from one metadata chunk (a guard "
        f"against decompression bombs; Pillow: {detail[:120]}); the pixels were not "
        f"decoded: save the image again without its {what} and send it again"
    )


def _png_inflating_chunk(data: bytes) -> bytes | None:
    """The first compressed metadata chunk before the pixel data that inflates past
    Pillow's per-chunk limit, or None (reads at most that limit + 1 byte per chunk)."""
    limit = PngImagePlugin.MAX_TEXT_CHUNK
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        body = data[pos + 8 : pos + 8 + length]
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind in _PNG_COMPRESSED_METADATA:
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


def _corrupt_message(fmt: str, detail: str) -> str:
    name = _FORMATS[fmt][0]
    return (
        f"image data looks like {name} but could not be decoded ({detail[:200]}): "
        "the file may be truncated or damaged; send the complete image file"
    )
