"""An image's header: format, mode, size as stored and as shown, EXIF orientation, bit depth;
read before any pixel memory is allocated, and refused there when it is over a limit.

`model_can_decode` says when TF Serving can decode the original bytes itself (no TensorFlow
here).
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass

from PIL import ExifTags, Image, ImageFile, PngImagePlugin, TiffImagePlugin

from gateway.imaging import jpeghead
from gateway.imaging.errors import EmptyImage, ImageTooLarge, UnsupportedImage
from gateway.imaging.formats import FORMATS, gif_size, sniff, translated_errors, webp_size


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


# Modes Pillow converts to RGB faithfully. "LAB" and "HSV" are left out on purpose:
# Pillow's convert("RGB") copies their channels as if they were RGB.
_CONVERTIBLE_MODES = frozenset(
    {"1", "L", "P", "PA", "LA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "I", "F"}
    | {"I;16", "I;16L", "I;16B", "I;16N"}
)


# PNG: 8-byte signature, then the IHDR chunk (length, type, width, height, bit depth, ...).
_PNG_BIT_DEPTH_OFFSET = 24


def inspect_image(data: bytes, limits: ImageLimits) -> ImageInfo:
    """Read the header only; refuse empty, unsupported, corrupt-header or over-limit images."""
    info = plain_jpeg_info(data, limits)
    if info is not None:
        return info
    image, info = open_image(data, limits)
    image.close()
    return info


def plain_jpeg_info(data: bytes, limits: ImageLimits) -> ImageInfo | None:
    """A plain JPEG's header read without Pillow (the same answer, faster: jpeghead), over-limit
    sizes refused; None for anything else, which open_image reads."""
    if data.startswith(b"\xff\xd8\xff") and len(data) <= limits.max_bytes:
        header = jpeghead.read(data)
        if header is not None:
            width, height, components, orientation = header
            check_pixels((width, height), limits)
            return ImageInfo("JPEG", "RGB" if components == 3 else "L", width, height, orientation)
    return None


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


def open_image(data: bytes, limits: ImageLimits) -> tuple[ImageFile.ImageFile, ImageInfo]:
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
    fmt = sniff(data)
    # GIF and WebP headers are read here because Pillow allocates pixel memory while
    # opening them (GIF's first-frame disposal buffer, libwebp's canvas).
    pre_size = gif_size(data) if fmt == "GIF" else webp_size(data) if fmt == "WEBP" else None
    if pre_size is not None:
        check_pixels(pre_size, limits)
    _let_pillow_allow(limits.max_pixels)
    with translated_errors(fmt, data):
        # The plugin class, not Image.open: Image.open runs Pillow's bomb check (a warning
        # or DecompressionBombError without the size) before we could give our own answer.
        # Constructing the class parses the header only.
        image_class = FORMATS[fmt][1]
        image = image_class(io.BytesIO(data))
        try:
            info = _describe(fmt, image, data, limits)
        except BaseException:
            image.close()
            raise
    return image, info


def _describe(fmt: str, image: ImageFile.ImageFile, data: bytes, limits: ImageLimits) -> ImageInfo:
    stored_width, stored_height = _stored_size(image)
    check_pixels((stored_width, stored_height), limits)
    if image.mode not in _CONVERTIBLE_MODES:
        raise UnsupportedImage(
            f"{FORMATS[fmt][0]} images in mode {image.mode} are not supported: "
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


def check_pixels(size: tuple[int, int], limits: ImageLimits) -> None:
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
