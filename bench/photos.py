"""The benchmark's photo-like test images: generated, deterministic, saved in bench/images/.

Real photos decode slower than flat synthetic scenes (more non-zero DCT coefficients), so
these have smooth shading at several scales, hard-edged objects and sensor noise, and are
saved as a camera would (JPEG quality 90, 4:2:0). The PNG is made from the 1080p JPEG's
pixels when the benchmark runs (a photo as PNG is several MB, not worth committing).

    python -m bench.photos     # (re)writes bench/images/photo_*.jpg
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

IMAGES = Path(__file__).resolve().parent / "images"
SIZES = ((640, 480), (1920, 1080), (4032, 3024))


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    total = np.full((height, width, 3), 128.0, np.float32)
    for cells, amplitude in ((3, 100.0), (12, 40.0), (60, 14.0)):
        coarse = rng.random((cells * height // width + 2, cells + 2, 3), dtype=np.float32)
        smooth = Image.fromarray((coarse * 255).astype(np.uint8)).resize(
            (width, height), Image.Resampling.BICUBIC
        )
        total += (np.asarray(smooth, np.float32) - 128) * amplitude / 128
    canvas = Image.fromarray(np.clip(total, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    for _ in range(12):  # objects: hard edges that JPEG has to spend bits on
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        w = int(rng.integers(width // 20, width // 5))
        h = int(rng.integers(height // 20, height // 4))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.rectangle((x, y, x + w, y + h), fill=colour)
        else:
            draw.ellipse((x, y, x + w, y + h), fill=colour)
    pixels = np.asarray(canvas, np.float32) + rng.normal(0, 3.0, (height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def path_for(width: int, height: int) -> Path:
    return IMAGES / f"photo_{width}x{height}.jpg"


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90, subsampling=2)
    return out.getvalue()


def png_bytes(jpeg: bytes) -> bytes:
    """The JPEG's pixels as PNG (zlib level 6, Pillow's default, like most PNG writers)."""
    out = io.BytesIO()
    with Image.open(io.BytesIO(jpeg)) as image:
        image.convert("RGB").save(out, "PNG")
    return out.getvalue()


def load() -> dict[str, bytes]:
    """name -> encoded image, e.g. "JPEG 1920x1080" (the PNG is derived on the fly)."""
    found = {f"JPEG {w}x{h}": path_for(w, h).read_bytes() for w, h in SIZES}
    found["PNG 1920x1080"] = png_bytes(found["JPEG 1920x1080"])
    return found


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    for seed, (width, height) in enumerate(SIZES):
        data = jpeg_bytes(photo(width, height, seed))
        path_for(width, height).write_bytes(data)
        print(f"{path_for(width, height)}: {len(data):,} bytes")


if __name__ == "__main__":
    main()
