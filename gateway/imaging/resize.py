"""Images at the size the model uses: a fixed size from the signature, or a longest side.

JPEGs at least twice the target are decoded smaller by libjpeg-turbo's DCT scaling (1/2,
1/4, 1/8; gateway.imaging.images), which is several times faster than a full decode, then
resized with an antialiased bilinear filter (Pillow's, as TF's resize with antialias=True).
Boxes come back from models as fractions of the image, so results map back to the original
image's pixels unchanged.
"""

from __future__ import annotations

import numpy as np
import simplejpeg
from PIL import Image

from gateway.imaging.images import ImageInfo, ImageLimits, decode_image, inspect_image

# Quality of the JPEG sent to string-input models in place of a larger original: high enough
# that the model sees what a direct decode of the original at that size would show.
JPEG_QUALITY = 92


def fit_within(width: int, height: int, max_side: int) -> tuple[int, int]:
    """(width, height) scaled down, keeping the aspect ratio, so the longest side is at most
    `max_side`; unchanged when it already is."""
    longest = max(width, height)
    if longest <= max_side:
        return width, height
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))


def resize(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """uint8 [h, w, 3] pixels resized to [height, width, 3] (a copy; the same array when the
    size already matches)."""
    if pixels.shape[1] == width and pixels.shape[0] == height:
        return pixels
    image = Image.fromarray(np.ascontiguousarray(pixels))
    return np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))


def decode_to_size(
    data: bytes, limits: ImageLimits, size: tuple[int, int]
) -> tuple[ImageInfo, np.ndarray]:
    """The image (as shown) stretched to exactly `size` (width, height), and its info."""
    info, pixels = decode_image(data, limits, min_size=size)
    return info, resize(pixels, *size)


def decode_within(data: bytes, limits: ImageLimits, max_side: int) -> tuple[ImageInfo, np.ndarray]:
    """The image (as shown) scaled down so its longest side is at most `max_side`."""
    info = inspect_image(data, limits)
    size = fit_within(info.width, info.height, max_side)
    if size == (info.width, info.height):
        return decode_image(data, limits)
    return decode_to_size(data, limits, size)


def encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """uint8 [h, w, 3] RGB pixels as a baseline JPEG (4:2:0, libjpeg-turbo)."""
    return bytes(simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality))
