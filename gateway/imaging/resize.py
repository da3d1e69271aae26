"""Images at the size the model uses: a fixed size from the signature, or a longest side.

JPEGs at least twice the target are decoded smaller by libjpeg-turbo's DCT scaling (1/2, 1/4,
1/8; gateway.imaging.decode), which is several times faster than a full decode, then resized by
libvips (pyvips; its wheel bundles the library) with an antialiased bilinear filter: the
triangle filter widened by the scale factor, as Pillow's BILINEAR and TF's resize with
antialias=True do. libvips' resampling is vectorised and runs on the machine's cores, several
times faster than Pillow on one core (bench/results.md). Its pixels differ from Pillow's by
0.1-0.7 levels on average (tests/imaging/test_resize.py; most of it at the edges, where libvips
repeats the edge pixels and Pillow narrows the filter). Enlarging (a fixed-size model fed a
smaller image) stays with Pillow: libvips places the pixels of an enlarged image differently,
and the cost follows the small input. Boxes come back from models as fractions of the image, so
results map back to the original image's pixels unchanged.

With a `resize_filter` (gateway.imaging.filters) the image is decoded at full size and
oriented first, then resized exactly as the exporter's library does: slower, the pixels the
model was trained on. The EXIF orientation is applied to the small result instead of the large
decoded image on the fast path.
libvips only resamples pixels the gateway has decoded: its file loaders are blocked, so no
caller bytes ever reach them.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np
import simplejpeg
from PIL import Image

from gateway.imaging import filters
from gateway.imaging.decode import decode_image, decode_stored
from gateway.imaging.header import ImageInfo, ImageLimits, inspect_image
from gateway.imaging.orientation import oriented_view

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
    return _resize_stored(pixels, 1, width, height)


def decode_to_size(
    data: bytes, limits: ImageLimits, size: tuple[int, int], resize_filter: str | None = None
) -> tuple[ImageInfo, np.ndarray]:
    """The image (as shown) stretched to exactly `size` (width, height), and its info: the
    fast path, or with `resize_filter` that exact filter (float32 pixels for TF's filters)."""
    return _decode_sized(data, limits, inspect_image(data, limits), size, resize_filter)


def decode_within(
    data: bytes, limits: ImageLimits, max_side: int, resize_filter: str | None = None
) -> tuple[ImageInfo, np.ndarray]:
    """The image (as shown) scaled down so its longest side is at most `max_side` (with
    `resize_filter` as decode_to_size)."""
    info = inspect_image(data, limits)
    size = fit_within(info.width, info.height, max_side)
    return _decode_sized(data, limits, info, size, resize_filter)


def _decode_sized(
    data: bytes,
    limits: ImageLimits,
    info: ImageInfo,
    size: tuple[int, int],
    resize_filter: str | None,
) -> tuple[ImageInfo, np.ndarray]:
    if size == (info.width, info.height):
        return decode_image(data, limits)
    if resize_filter is not None:
        info, pixels = decode_image(data, limits)
        return info, filters.resize_exact(pixels, *size, resize_filter)
    info, stored, orientation = decode_stored(data, limits, min_size=size)
    return info, _resize_stored(stored, orientation, *size)


def encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """uint8 [h, w, 3] RGB pixels as a baseline JPEG with 4:2:0 chroma, as cameras save
    photos (libjpeg-turbo). simplejpeg's default, 4:4:4, is larger and slower both to encode
    and for the model to decode."""
    return bytes(
        simplejpeg.encode_jpeg(
            np.ascontiguousarray(pixels), quality=quality, colorsubsampling="420"
        )
    )


# --- resizing -----------------------------------------------------------------------------


def _resize_stored(
    stored: np.ndarray | Image.Image, orientation: int, width: int, height: int
) -> np.ndarray:
    """`stored` pixels (uint8 [h, w, 3] or a Pillow "RGB" image) as shown after the EXIF
    `orientation`, resized to (width, height): a read-only uint8 [height, width, 3] array."""
    if isinstance(stored, np.ndarray):
        stored_height, stored_width = stored.shape[:2]
    else:
        stored_width, stored_height = stored.size
    # The size to resize the stored pixels to, so that orienting them gives width x height.
    target = (height, width) if orientation >= 5 else (width, height)
    if target == (stored_width, stored_height):
        pixels = np.asarray(stored)
    elif target[0] <= stored_width and target[1] <= stored_height:
        pixels = _shrink(np.ascontiguousarray(stored), *target)
    else:
        # Enlarging on at least one axis (see the module docstring).
        image = stored if isinstance(stored, Image.Image) else Image.fromarray(stored)
        pixels = np.asarray(image.resize(target, Image.Resampling.BILINEAR))
    out = np.ascontiguousarray(oriented_view(pixels, orientation))
    out.flags.writeable = False
    return out


_threads = 0  # libvips' threads per resize; 0: as many as the processors it sees


def use_threads(threads: int) -> None:
    """Threads libvips gives one resize: the gateway's decode threads, which follow the CPU
    limit (GATEWAY_DECODE_THREADS). libvips' own default is the processors the process may
    run on, which in a container with a CPU quota can be all of the node's."""
    global _threads
    _threads = threads
    if _vips.cache_info().currsize:
        _vips().concurrency_set(threads)


@functools.cache
def _vips() -> ModuleType:
    """pyvips, imported at the first resize: libvips adds about 9 MiB to every process,
    and a gateway whose models take the images as they come never needs it."""
    import pyvips

    if _threads:
        pyvips.concurrency_set(_threads)
    # No operation cache: every request's pixels are new, and cached results would keep them.
    pyvips.cache_set_max(0)
    # Defence in depth: the gateway hands libvips decoded pixels only, never encoded bytes.
    pyvips.operation_block_set("VipsForeignLoad", True)
    return pyvips


def _shrink(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """C-contiguous uint8 [h, w, 3] pixels scaled down (or kept) on each axis by libvips."""
    stored_height, stored_width = pixels.shape[:2]
    image = _vips().Image.new_from_memory(pixels.data, stored_width, stored_height, 3, "uchar")
    resized = image.resize(width / stored_width, vscale=height / stored_height, kernel="linear")
    if (resized.width, resized.height) != (width, height):  # the scales round back to the size
        raise RuntimeError(
            f"libvips resized to {resized.width}x{resized.height}, not {width}x{height}"
        )
    return np.frombuffer(resized.write_to_memory(), np.uint8).reshape(height, width, 3)
