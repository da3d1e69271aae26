"""Deterministic test scenes for the reference detector: coloured rectangles on a background.

TensorFlow-free (numpy and Pillow only) so that gateway tests can import it. The colour
palette lives here, next to the only other code that paints it; `serving.detector` imports
it from this module.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class PaletteColour:
    """One detectable class: its label map id and name and the RGB colour it is painted in."""

    class_id: int
    name: str
    display_name: str
    rgb: tuple[int, int, int]


# Class ids are 1-based like TF Object Detection API label maps (0 is background).
# The colours are saturated and far apart (>= 190 in RGB distance), so JPEG chroma blur
# between two of them never lands near a third.
PALETTE: tuple[PaletteColour, ...] = (
    PaletteColour(1, "red_box", "red box", (230, 25, 25)),
    PaletteColour(2, "green_box", "green box", (25, 200, 25)),
    PaletteColour(3, "blue_box", "blue box", (25, 25, 230)),
    PaletteColour(4, "yellow_box", "yellow box", (240, 220, 20)),
)

# A random background colour must be at least this far (Euclidean RGB distance) from every
# palette colour; the detector's colour threshold is well below it (see serving.detector).
MIN_BACKGROUND_DISTANCE = 160.0

# Rectangles are at least this many pixels wide and high, and at least GAP pixels apart.
MIN_RECT_SIDE = 8
RECT_GAP = 4


@dataclass(frozen=True)
class GroundTruthBox:
    """A painted rectangle in pixel coordinates; x_max and y_max are exclusive."""

    class_id: int
    label: str
    x_min: int
    y_min: int
    x_max: int
    y_max: int


@dataclass
class Scene:
    """A generated image (uint8, height x width x 3, RGB) and the rectangles painted on it."""

    pixels: np.ndarray
    boxes: list[GroundTruthBox] = field(default_factory=list)
    background: tuple[int, int, int] = (128, 128, 128)
    noise_sigma: float = 0.0

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])


def palette_distance(rgb: tuple[int, int, int] | np.ndarray) -> float:
    """Smallest Euclidean RGB distance from `rgb` to any palette colour."""
    colours = np.array([c.rgb for c in PALETTE], dtype=np.float64)
    return float(np.min(np.linalg.norm(colours - np.asarray(rgb, dtype=np.float64), axis=1)))


def random_background(rng: np.random.Generator) -> tuple[int, int, int]:
    """A random RGB colour at least MIN_BACKGROUND_DISTANCE away from the palette."""
    while True:
        r, g, b = (int(v) for v in rng.integers(0, 256, size=3))
        if palette_distance((r, g, b)) >= MIN_BACKGROUND_DISTANCE:
            return (r, g, b)


def _overlaps(box: GroundTruthBox, others: list[GroundTruthBox], gap: int) -> bool:
    """True if `box`, grown by `gap` pixels on every side, intersects any of `others`."""
    for o in others:
        if (
            box.x_min - gap < o.x_max
            and o.x_min < box.x_max + gap
            and box.y_min - gap < o.y_max
            and o.y_min < box.y_max + gap
        ):
            return True
    return False


def _random_box(
    rng: np.random.Generator, width: int, height: int, min_side: int, max_side: int
) -> GroundTruthBox:
    colour = PALETTE[int(rng.integers(len(PALETTE)))]
    w = int(rng.integers(min_side, min(max_side, width) + 1))
    h = int(rng.integers(min_side, min(max_side, height) + 1))
    x0 = int(rng.integers(0, width - w + 1))
    y0 = int(rng.integers(0, height - h + 1))
    # Snap to an image border now and then: boxes touching the border are a classic edge case.
    if rng.random() < 0.15:
        x0 = 0 if rng.random() < 0.5 else width - w
    if rng.random() < 0.15:
        y0 = 0 if rng.random() < 0.5 else height - h
    return GroundTruthBox(colour.class_id, colour.name, x0, y0, x0 + w, y0 + h)


def generate_scene(
    rng: np.random.Generator,
    width: int,
    height: int,
    n_rects: int,
    noise_sigma: float = 0.0,
    background: tuple[int, int, int] | None = None,
    min_side: int = MIN_RECT_SIDE,
    max_side: int | None = None,
    gap: int = RECT_GAP,
    max_attempts: int = 200,
) -> Scene:
    """Paints up to `n_rects` non-overlapping palette rectangles on a (noisy) background.

    Rectangles are placed by rejection sampling (each needs `gap` pixels of background around
    it); when one does not fit after `max_attempts` tries, the scene simply has fewer. Gaussian
    noise of `noise_sigma` is added to the whole image, rectangles included. The result depends
    only on the state of `rng` and the arguments.
    """
    if width < min_side or height < min_side:
        raise ValueError(f"a {width}x{height} image cannot hold a {min_side}-pixel rectangle")
    if background is None:
        background = random_background(rng)
    if max_side is None:
        # About a third of the short side leaves room for several rectangles.
        max_side = max(min_side, min(width, height) // 3)

    boxes: list[GroundTruthBox] = []
    for _ in range(n_rects):
        for _ in range(max_attempts):
            box = _random_box(rng, width, height, min_side, max_side)
            if not _overlaps(box, boxes, gap):
                boxes.append(box)
                break

    image = np.empty((height, width, 3), dtype=np.float32)
    image[:, :] = background
    colours = {c.class_id: c.rgb for c in PALETTE}
    for box in boxes:
        image[box.y_min : box.y_max, box.x_min : box.x_max] = colours[box.class_id]
    if noise_sigma > 0:
        # float32 noise: about twice as fast as float64 for multi-megapixel scenes.
        image += np.float32(noise_sigma) * rng.standard_normal(size=image.shape, dtype=np.float32)
    pixels = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return Scene(pixels=pixels, boxes=boxes, background=background, noise_sigma=noise_sigma)


def sample_scene() -> Scene:
    """`make run`'s sample picture (tools/devrun.py writes it as models/samples/scene.jpg):
    five rectangles on a noisy 640x480 background, the same every time."""
    return generate_scene(np.random.default_rng(7), 640, 480, 5, noise_sigma=6.0)


def shapes_scene(width: int = 640, height: int = 480, noise_sigma: float = 0.0) -> Scene:
    """Four shapes, one per palette colour, on grey: a red disc, a green L, a blue ring and a
    yellow upright bar, for the reference segmenter and keypoint model (one instance per
    colour: serving.instances). `boxes` are the shapes' bounding boxes; `shape_masks` gives
    each one's pixels. `make run` writes it as models/samples/shapes.jpg."""
    masks = shape_masks(width, height)
    image = np.empty((height, width, 3), dtype=np.float32)
    image[:, :] = SHAPES_BACKGROUND
    boxes = []
    for colour in PALETTE:
        mask = masks[colour.class_id]
        image[mask] = colour.rgb
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        boxes.append(
            GroundTruthBox(
                colour.class_id,
                colour.name,
                int(cols[0]),
                int(rows[0]),
                int(cols[-1]) + 1,
                int(rows[-1]) + 1,
            )
        )
    if noise_sigma > 0:
        rng = np.random.default_rng(11)
        image += np.float32(noise_sigma) * rng.standard_normal(size=image.shape, dtype=np.float32)
    pixels = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return Scene(pixels=pixels, boxes=boxes, background=SHAPES_BACKGROUND, noise_sigma=noise_sigma)


# Grey, >= MIN_BACKGROUND_DISTANCE from every palette colour.
SHAPES_BACKGROUND = (128, 128, 128)


def shape_masks(width: int, height: int) -> dict[int, np.ndarray]:
    """shapes_scene's shapes as bool [height, width] masks, by class id (the four quarters of
    the picture, one shape each, sized to it)."""
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32) + 0.5
    unit = min(width, height) / 8  # a quarter is at least 4 x 4 units
    w2, h2 = width / 2, height / 2
    # Red: a disc in the top-left quarter.
    disc = (xs - w2 / 2) ** 2 + (ys - h2 / 2) ** 2 <= (1.6 * unit) ** 2
    # Green: an L in the top-right quarter (a square without its top-right quarter).
    x0, y0 = w2 + w2 / 2 - 1.5 * unit, h2 / 2 - 1.5 * unit
    inside = (xs >= x0) & (xs < x0 + 3 * unit) & (ys >= y0) & (ys < y0 + 3 * unit)
    corner = (xs >= x0 + 1.5 * unit) & (ys < y0 + 1.5 * unit)
    ell = inside & ~corner
    # Blue: a ring in the bottom-left quarter.
    r2 = (xs - w2 / 2) ** 2 + (ys - h2 - h2 / 2) ** 2
    ring = (r2 <= (1.6 * unit) ** 2) & (r2 >= (0.8 * unit) ** 2)
    # Yellow: an upright bar (a person's proportions) in the bottom-right quarter.
    bar = (np.abs(xs - w2 - w2 / 2) <= 0.7 * unit) & (np.abs(ys - h2 - h2 / 2) <= 1.7 * unit)
    return {1: disc, 2: ell, 3: ring, 4: bar}


def encode(pixels: np.ndarray, fmt: Literal["PNG", "JPEG"] = "PNG", quality: int = 90) -> bytes:
    """Encodes an RGB uint8 image as PNG or JPEG (Pillow's default 4:2:0 chroma subsampling)."""
    buffer = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8))
    if fmt == "JPEG":
        image.save(buffer, format="JPEG", quality=quality)
    elif fmt == "PNG":
        # Fastest zlib level: a noisy 2000x2000 scene takes ~0.2 s instead of ~1.4 s.
        image.save(buffer, format="PNG", compress_level=1)
    else:
        raise ValueError(f"unsupported format {fmt!r}; use 'PNG' or 'JPEG'")
    return buffer.getvalue()


def decode(data: bytes) -> np.ndarray:
    """Decodes image bytes to an RGB uint8 array (for round-tripping encoded test scenes)."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)


# ----- colour-share images for the reference classifiers --------------------------------------

# Band edges fall on multiples of this many pixels: JPEG codes 16x16 blocks (4:2:0), so a
# band edge on a block edge is not smeared across the block by the DCT.
COLOUR_BAND_ALIGN = 16


@dataclass(frozen=True)
class ColourImage:
    """A generated image made of solid bands of palette colours (plus optional noise)."""

    pixels: np.ndarray  # uint8 [H, W, 3]
    colours: tuple[str, ...]  # the band colours, dominant first
    horizontal: bool  # bands are rows (True) or columns (False)


def generate_colour_image(
    rng: np.random.Generator,
    width: int,
    height: int,
    palette: dict[str, tuple[int, int, int]],
    n_colours: int = 3,
    dominant_share: float = 0.6,
    noise_sigma: float = 0.0,
) -> ColourImage:
    """Paints `n_colours` palette colours as contiguous bands, the first covering about
    `dominant_share` of the image and the others splitting the rest about evenly.

    Bands are whole multiples of COLOUR_BAND_ALIGN pixels (the last unit takes the remainder),
    so the actual shares are close to, not exactly, the requested ones: measure them on the
    pixels. Gaussian noise of `noise_sigma` is added to every pixel.
    """
    names = list(palette)
    chosen = [names[int(i)] for i in rng.choice(len(names), size=n_colours, replace=False)]
    horizontal = bool(rng.random() < 0.5)
    length = height if horizontal else width
    units = length // COLOUR_BAND_ALIGN
    if units >= n_colours:
        edges = np.arange(units + 1) * COLOUR_BAND_ALIGN
        edges[-1] = length
    else:  # too small to align: equal bands
        units = n_colours
        edges = np.linspace(0, length, units + 1).round().astype(int)
    dominant_units = max(1, min(units - (n_colours - 1), round(dominant_share * units)))
    rest = units - dominant_units
    counts = [dominant_units] + [
        rest // (n_colours - 1) + (1 if i < rest % (n_colours - 1) else 0)
        for i in range(n_colours - 1)
    ]
    order = rng.permutation(n_colours)
    image = np.empty((height, width, 3), dtype=np.float32)
    start = 0
    for index in order:
        stop = start + counts[index]
        band = slice(int(edges[start]), int(edges[stop]))
        if horizontal:
            image[band, :] = palette[chosen[index]]
        else:
            image[:, band] = palette[chosen[index]]
        start = stop
    if noise_sigma > 0:
        image += np.float32(noise_sigma) * rng.standard_normal(size=image.shape, dtype=np.float32)
    pixels = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return ColourImage(pixels=pixels, colours=tuple(chosen), horizontal=horizontal)


def resize(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """Bilinear resize with Pillow (antialiased when shrinking), as an image gateway would do
    before sending a fixed-size tensor; returns uint8 [height, width, 3]."""
    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8))
    return np.asarray(image.resize((width, height), Image.Resampling.BILINEAR), dtype=np.uint8)
