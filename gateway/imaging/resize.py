"""Images at the size the model uses: a fixed size from the signature, or a longest side.

JPEGs at least twice the target are decoded smaller by libjpeg-turbo's DCT scaling (1/2,
1/4, 1/8; gateway.imaging.images), which is several times faster than a full decode, then
resized with an antialiased bilinear filter (Pillow's, as TF's resize with antialias=True).
Boxes come back from models as fractions of the image, so results map back to the original
image's pixels unchanged.

The resized pixels are bit-identical to one Pillow BILINEAR `resize` of the decoded image
as shown (after EXIF orientation), computed with fewer copies and on more than one core:

- The orientation is applied around the resize instead of to the large decoded image.
  Pillow resamples in two passes, one per axis, each rounded to 8 bits, and Pillow 13 picks
  their order from the sizes (`_horizontal_first`). For the orientations that transpose
  (5 to 8) one resize of the stored pixels would run the passes in the other order and
  differ by a level in some pixels, so the passes run one axis at a time, in the order
  Pillow uses for the image as shown, and the small result is transposed. Mirroring
  orientations flip the stored pixels before resizing (a cheap copy, band by band):
  resizing first and flipping after gave the same pixels in every case tried, but nothing
  in Pillow's floating-point coefficients guarantees it.
- Resizes from or to at least _BAND_MIN_PIXELS pixels are computed in bands, one on the
  calling thread and the others on helper threads (Pillow releases the GIL while
  resampling). A band is a range of output lines along one axis, resampled from just the
  input lines it needs with a `box` on that axis. Pillow derives the band's filter
  coefficients from that box (as 32-bit floats), which can round differently from the
  whole image's, so bands are cut only where a replica of Pillow's computation
  (`_coefficients`) gives exactly the whole image's coefficients; otherwise the image is
  resized in one piece.
- JPEGs are decoded to RGB, not RGBX: RGBX would spare one conversion into Pillow's pixel
  layout (about a millisecond, done band by band here), but Pillow then resamples the
  fourth channel too, which costs more (about a quarter of the resize).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import simplejpeg
from PIL import Image

from gateway.imaging.images import (
    ImageInfo,
    ImageLimits,
    decode_image,
    decode_stored,
    inspect_image,
)

# Quality of the JPEG sent to string-input models in place of a larger original: high enough
# that the model sees what a direct decode of the original at that size would show.
JPEG_QUALITY = 92

_FILTER = Image.Resampling.BILINEAR
# A resize from and to fewer pixels than this takes a few milliseconds and runs in one
# piece (the first pass costs in proportion to the input, the second to the output).
_BAND_MIN_PIXELS = 256 * 1024
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
# Threads working on one resize: the caller's and up to three helpers (shared by all
# callers). With one core there are no bands.
_BANDS = min(_CPUS or 1, 4)
_HELPERS = max(1, _BANDS - 1)

# Rows and columns (numpy axes of an [height, width, 3] array).
_ROWS, _COLUMNS = 0, 1

# EXIF orientation -> (flip rows, flip columns, transpose): the image as shown is the stored
# one flipped, then transposed. The same pixels as images._oriented_view, which transposes
# first and flips after.
_ORIENT = {
    1: (False, False, False),
    2: (False, True, False),
    3: (True, True, False),
    4: (True, False, False),
    5: (False, False, True),
    6: (True, False, True),
    7: (True, True, True),
    8: (False, True, True),
}
_FLIPS = {
    (True, False): Image.Transpose.FLIP_TOP_BOTTOM,
    (False, True): Image.Transpose.FLIP_LEFT_RIGHT,
    (True, True): Image.Transpose.ROTATE_180,
}


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
    data: bytes, limits: ImageLimits, size: tuple[int, int]
) -> tuple[ImageInfo, np.ndarray]:
    """The image (as shown) stretched to exactly `size` (width, height), and its info."""
    info = inspect_image(data, limits)
    if size == (info.width, info.height):
        return decode_image(data, limits)
    info, stored, orientation = decode_stored(data, limits, min_size=size)
    return info, _resize_stored(stored, orientation, *size)


def decode_within(data: bytes, limits: ImageLimits, max_side: int) -> tuple[ImageInfo, np.ndarray]:
    """The image (as shown) scaled down so its longest side is at most `max_side`."""
    info = inspect_image(data, limits)
    size = fit_within(info.width, info.height, max_side)
    if size == (info.width, info.height):
        return decode_image(data, limits)
    info, stored, orientation = decode_stored(data, limits, min_size=size)
    return info, _resize_stored(stored, orientation, *size)


def encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """uint8 [h, w, 3] RGB pixels as a baseline JPEG with 4:2:0 chroma, as cameras save
    photos (libjpeg-turbo). simplejpeg's default, 4:4:4, is half as large again and takes
    about 1.8 times as long to encode and 1.5 times as long for the model to decode (a
    12 MP photo scaled to 1024x768: 2.9 against 1.6 ms, and 2.4 against 1.6 ms in TF)."""
    return bytes(
        simplejpeg.encode_jpeg(
            np.ascontiguousarray(pixels), quality=quality, colorsubsampling="420"
        )
    )


# --- resizing -----------------------------------------------------------------------------


class _Band(NamedTuple):
    """Output lines [start, stop) along one axis, resized from input lines [first, last)
    with the box (low, high) in those lines' coordinates."""

    start: int
    stop: int
    first: int
    last: int
    low: float
    high: float


class _Coefficients(NamedTuple):
    """Per output line: the first input line, how many are used, and their fixed-point
    weights (zero past those used)."""

    first: np.ndarray
    used: np.ndarray
    weights: np.ndarray


def _resize_stored(
    stored: np.ndarray | Image.Image, orientation: int, width: int, height: int
) -> np.ndarray:
    """`stored` pixels (uint8 [h, w, 3] or a Pillow "RGB" image) as shown after the EXIF
    `orientation`, resized to (width, height): a read-only uint8 [height, width, 3] array,
    bit-identical to Pillow's BILINEAR resize of the shown image."""
    flip_rows, flip_columns, transposed = _ORIENT[orientation]
    if isinstance(stored, np.ndarray):
        stored_height, stored_width = stored.shape[:2]
    else:
        stored_width, stored_height = stored.size
    shown = (stored_height, stored_width) if transposed else (stored_width, stored_height)
    # The passes in the order Pillow runs them for the shown image, as stored axes.
    horizontal_first = _horizontal_first(*shown, width, height)
    passes = (_COLUMNS, _ROWS) if horizontal_first != transposed else (_ROWS, _COLUMNS)
    # (input, output) lines per stored axis.
    target = (height, width) if transposed else (width, height)
    lines = {_COLUMNS: (stored_width, target[0]), _ROWS: (stored_height, target[1])}

    split = _split(lines, max(stored_width * stored_height, width * height))
    if split is None and not transposed:  # one piece: Pillow's own resize, as before
        image = _region(stored, _ROWS, 0, stored_height, False)
        if flip_rows or flip_columns:
            image = image.transpose(_FLIPS[flip_rows, flip_columns])
        return np.asarray(image.resize((width, height), _FILTER))
    if split is None:
        axis = passes[0]
        in_lines, out_lines = lines[axis]
        bands: tuple[_Band, ...] = (_Band(0, out_lines, 0, in_lines, 0.0, float(in_lines)),)
    else:
        axis, bands = split

    def resized(band: _Band) -> Image.Image:
        flipped = flip_rows if axis == _ROWS else flip_columns
        image = _region(stored, axis, band.first, band.last, flipped)
        if flip_rows or flip_columns:
            image = image.transpose(_FLIPS[flip_rows, flip_columns])
        for pass_axis in passes:
            in_lines, out_lines = lines[pass_axis]
            if in_lines == out_lines:
                continue  # Pillow skips this pass too
            if pass_axis == axis:
                image = _one_pass(image, pass_axis, band.stop - band.start, band.low, band.high)
            else:
                image = _one_pass(image, pass_axis, out_lines, 0.0, float(in_lines))
        if transposed:
            image = image.transpose(Image.Transpose.TRANSPOSE)
        return image

    if len(bands) == 1:
        return np.asarray(resized(bands[0]))

    out = np.empty((height, width, 3), np.uint8)
    shown_axis = 1 - axis if transposed else axis

    def into_out(band: _Band) -> None:
        where = (slice(None),) * shown_axis + (slice(band.start, band.stop),)
        np.copyto(out[where], np.asarray(resized(band)))

    _run([functools.partial(into_out, band) for band in bands])
    out.flags.writeable = False
    return out


def _region(
    stored: np.ndarray | Image.Image, axis: int, first: int, last: int, flipped: bool
) -> Image.Image:
    """Lines [first, last) along `axis` of the stored pixels as a Pillow image, counting
    the lines from the far end when `flipped` (the caller flips the region itself)."""
    size = stored.shape[axis] if isinstance(stored, np.ndarray) else stored.size[1 - axis]
    if flipped:
        first, last = size - last, size - first
    if isinstance(stored, np.ndarray):
        if (first, last) != (0, size):
            stored = stored[first:last] if axis == _ROWS else stored[:, first:last]
        return Image.fromarray(stored)
    if (first, last) == (0, size):
        return stored
    width, height = stored.size
    return stored.crop((0, first, width, last) if axis == _ROWS else (first, 0, last, height))


def _one_pass(image: Image.Image, axis: int, lines: int, low: float, high: float) -> Image.Image:
    """`image` resampled along `axis` only: input lines [low, high) to `lines` lines. With
    the other axis unchanged Pillow runs a single pass, the same as in a full resize."""
    width, height = image.size
    if axis == _ROWS:
        return image.resize((width, lines), _FILTER, box=(0, low, width, high))
    return image.resize((lines, height), _FILTER, box=(low, 0, high, height))


def _horizontal_first(in_width: int, in_height: int, out_width: int, out_height: int) -> bool:
    """Whether Pillow's resize from in_width x in_height to out_width x out_height runs its
    horizontal pass before the vertical one. Pillow 13 (ImagingResampleInner) runs the
    vertical pass first when the height shrinks by more than twice as many pixels as the
    width; the order matters because each pass rounds to 8 bits."""
    shrink = in_height - out_height
    return not (shrink > 0 and shrink > (in_width - out_width) * 2)


# --- bands --------------------------------------------------------------------------------


def _split(lines: dict[int, tuple[int, int]], pixels: int) -> tuple[int, tuple[_Band, ...]] | None:
    """The axis and bands to resize in parallel, or None to resize in one piece."""
    if _BANDS < 2 or pixels < _BAND_MIN_PIXELS:
        return None
    for axis in (_ROWS, _COLUMNS):  # rows first: a range of rows is contiguous in memory
        bands = _bands(*lines[axis], _BANDS)
        if bands is not None:
            return axis, bands
    return None


@functools.lru_cache(maxsize=1024)
def _bands(in_lines: int, out_lines: int, parts: int) -> tuple[_Band, ...] | None:
    """Up to `parts` bands of about the same size whose resampling is bit-identical to the
    whole axis's, or None when there are not two."""
    if out_lines < 2 * parts:
        return None
    if in_lines == out_lines:  # no pass on this axis: a band is a plain range of lines
        edges = [out_lines * i // parts for i in range(parts + 1)]
        return tuple(_Band(a, b, a, b, 0.0, float(b - a)) for a, b in itertools.pairwise(edges))
    whole = _coefficients(in_lines, 0.0, float(in_lines), out_lines)
    # Output lines whose input edge is a multiple of 2**-12: exact as a 32-bit float box
    # edge (up to 4096 input lines), so the band's scale and centres can match the whole's.
    step = out_lines // math.gcd(out_lines, in_lines << 12)
    reach = out_lines / (2 * parts)  # how far a cut may move from an equal split
    bands: list[_Band] = []
    start = 0
    for i in range(1, parts):
        ideal = out_lines * i / parts
        nearest = round(ideal / step)
        for k in sorted(range(nearest - 3, nearest + 4), key=lambda k: abs(k * step - ideal)):
            cut = k * step
            if start < cut < out_lines and abs(cut - ideal) <= reach:
                band = _band(whole, in_lines, out_lines, start, cut)
                if band is not None:
                    bands.append(band)
                    start = cut
                    break
    while True:
        last = _band(whole, in_lines, out_lines, start, out_lines)
        if last is not None:
            bands.append(last)
            break
        if not bands:
            return None
        start = bands.pop().start  # merge with the band before and try again
    return tuple(bands) if len(bands) > 1 else None


def _band(
    whole: _Coefficients, in_lines: int, out_lines: int, start: int, stop: int
) -> _Band | None:
    """Output lines [start, stop) as a band, if Pillow computes them exactly as in `whole`."""
    first = int(whole.first[start])
    last = int((whole.first[start:stop] + whole.used[start:stop]).max())
    low = float(Fraction(start * in_lines, out_lines) - first)
    high = float(Fraction(stop * in_lines, out_lines) - first)
    if not 0 <= np.float32(low) <= np.float32(high) <= last - first:
        return None  # Pillow would refuse the box
    part = _coefficients(last - first, low, high, stop - start)
    whole_first, whole_weights = _effective(whole, start, stop)
    part_first, part_weights = _effective(part, 0, stop - start)
    same = (
        part_weights.shape == whole_weights.shape
        and np.array_equal(part_first + first, whole_first)
        and np.array_equal(part_weights, whole_weights)
    )
    return _Band(start, stop, first, last, low, high) if same else None


def _effective(coefficients: _Coefficients, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """For output lines [start, stop): the first input line with a non-zero fixed-point
    weight, and the weights from that line on. A window can start one line earlier with a
    weight of zero there (its edge lands exactly on the filter's support), which changes
    nothing in the sums."""
    weights = coefficients.weights[start:stop]
    nonzero = weights != 0
    lead = nonzero.argmax(axis=1)  # 0 for a line without weights
    taps = weights.shape[1]
    padded = np.concatenate([weights, np.zeros_like(weights)], axis=1)
    shifted = np.take_along_axis(padded, lead[:, None] + np.arange(taps), axis=1)
    return coefficients.first[start:stop] + lead, shifted


def _coefficients(in_lines: int, low: float, high: float, out_lines: int) -> _Coefficients:
    """Pillow's BILINEAR coefficients for resampling input lines [low, high) of `in_lines`
    to `out_lines`, computed in the same floating-point steps as Pillow 13's Resample.c
    (precompute_coeffs, then normalize_coeffs_8bpc): the box edges are 32-bit floats, the
    rest doubles (the build uses no fused multiply-add), and the weights are summed in
    order."""
    low32, high32 = np.float32(low), np.float32(high)
    scale = float(high32 - low32) / out_lines
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale  # BILINEAR's support is 1
    ksize = math.ceil(support) * 2 + 1
    center = float(low32) + (np.arange(out_lines) + 0.5) * scale
    first = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C casts truncate
    count = np.minimum((center + support + 0.5).astype(np.int64), in_lines) - first
    taps = np.arange(ksize)
    x = np.abs(
        ((first[:, None] + taps).astype(np.float64) - center[:, None] + 0.5) * (1.0 / filterscale)
    )
    weights = np.where((x < 1.0) & (taps < count[:, None]), 1.0 - x, 0.0)
    total = np.zeros(out_lines)
    for tap in range(ksize):
        total = total + weights[:, tap]
    weights = weights / np.where(total == 0.0, 1.0, total)[:, None]
    fixed = (0.5 + weights * (1 << 22)).astype(np.int64)
    return _Coefficients(first, count, fixed)


# --- helper threads -----------------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_HELPERS, thread_name_prefix="resize")
        return _pool


def _forget_helpers() -> None:
    """In a forked child: the parent's helper threads do not exist here."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)


def _run(tasks: list[Callable[[], None]]) -> None:
    """Run every task: the first here, the others on the helper threads. A task still
    queued when this thread gets to it is taken back and run here, so a pool kept busy by
    other callers never makes this one wait for their work; the helpers never wait on
    anything, so this cannot deadlock."""
    pool = _helpers()
    futures: list[Future[None] | None] = []
    for task in tasks[1:]:
        try:
            futures.append(pool.submit(task))
        except RuntimeError:  # the interpreter is shutting down: run it here
            futures.append(None)
    try:
        tasks[0]()
        for future, task in zip(futures, tasks[1:], strict=True):
            if future is None or future.cancel():
                task()
            else:
                future.result()
    except BaseException:
        for future in futures:
            if future is not None:
                future.cancel()
        raise
