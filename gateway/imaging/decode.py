"""Decoding: encoded bytes in, RGB pixels out (as a viewer shows them, or as stored for
resizing), and PNG encoding for transcoding.

RGB and grayscale JPEGs go through libjpeg-turbo (simplejpeg), at a DCT-scaled size when the
caller needs less, their header read without Pillow when it is plain (gateway.imaging.
jpeghead); everything else, and any JPEG libjpeg-turbo warns about, through Pillow, whose
answer decides. Every Pillow failure becomes an ImageError (gateway.imaging.errors).
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import simplejpeg
from PIL import Image, ImageFile

from gateway.imaging.formats import translated_errors
from gateway.imaging.header import ImageInfo, ImageLimits, open_image, plain_jpeg_info
from gateway.imaging.orientation import TRANSPOSE, oriented_view

# Where decode_image writes pixels: gets the image's info, returns a writable uint8 array
# [info.height, info.width, 3] (C-contiguous).
PixelSink = Callable[[ImageInfo], np.ndarray]


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
    plain = plain_jpeg_info(data, limits)  # most requests: no Pillow at all
    if plain is not None:
        pixels = _decode_jpeg(data, plain, into, _dct_denominator(plain, min_size))
        if pixels is not None:
            return plain, pixels
    image, info = open_image(data, limits)
    with image:
        if plain is None and info.format == "JPEG" and info.mode in ("RGB", "L"):
            pixels = _decode_jpeg(data, info, into, _dct_denominator(info, min_size))
            if pixels is not None:
                return info, pixels
        with translated_errors(info.format, data):
            rgb = _to_rgb(image)
            # Pillow's TIFF plugin applies the orientation itself while loading (from the same
            # cached EXIF we read); every other plugin hands us the stored pixels.
            if info.orientation in TRANSPOSE and info.format != "TIFF":
                rgb = rgb.transpose(TRANSPOSE[info.orientation])
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
    plain = plain_jpeg_info(data, limits)
    if plain is not None:
        stored = _decode_jpeg_stored(data, plain, _dct_denominator(plain, min_size))
        if stored is not None:
            return plain, stored, plain.orientation
    image, info = open_image(data, limits)
    with image:
        if plain is None and info.format == "JPEG" and info.mode in ("RGB", "L"):
            stored = _decode_jpeg_stored(data, info, _dct_denominator(info, min_size))
            if stored is not None:
                return info, stored, info.orientation
        with translated_errors(info.format, data):
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
        # of these (it ignores libjpeg warnings) and reports the rest.
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


def encode_png(pixels: np.ndarray) -> bytes:
    """Encode uint8 [height, width, 3] pixels as PNG, favouring speed over size (transcoding)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [height, width, 3], got {pixels.dtype} {pixels.shape}")
    out = io.BytesIO()
    # Level 1 is several times faster than the default 6 and the bytes only cross the
    # gateway -> TF Serving hop, where size matters far less than latency.
    Image.fromarray(pixels).save(out, format="PNG", compress_level=1)
    return out.getvalue()


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
