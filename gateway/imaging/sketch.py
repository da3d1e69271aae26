"""A picture to draw a result on, for the client's `--draw`: the image as a viewer shows it
(EXIF orientation applied, as the gateway's pixels), with boxes, labels, points, lines and mask
overlays in one colour. Each task draws its own result with these (its folder's drawing.py,
named by its binding); Pillow, imported only when drawing."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Boxes, points and label backgrounds in this colour, label text in white.
DRAW_COLOUR = (255, 0, 255)
# How much of a mask's colour covers the picture under it.
MASK_OPACITY = 0.45


class Sketch:
    def __init__(self, image: bytes) -> None:
        from PIL import Image, ImageDraw, ImageFont, ImageOps

        self._image_module = Image
        self.picture = ImageOps.exif_transpose(Image.open(io.BytesIO(image))).convert("RGB")
        self.width, self.height = self.picture.size
        self.canvas: Any = ImageDraw.Draw(self.picture)
        self.text_size = max(12, self.width // 50)
        self.font = ImageFont.load_default(self.text_size)
        self.line_width = max(2, self.width // 320)

    def box(self, box: dict[str, int]) -> None:
        """A pixel box of the result (min inclusive, max exclusive) as an outline."""
        self.canvas.rectangle(
            (box["x_min"], box["y_min"], box["x_max"] - 1, box["y_max"] - 1),
            outline=DRAW_COLOUR,
            width=self.line_width,
        )

    def label(self, text: str, left_x: float, top_y: float, under: int = 0) -> None:
        """`text` in white on the colour, above (left_x, top_y), or below it at the top edge;
        `under` = n: on the nth line under that label (what a pipeline's steps attached to
        an instance, under the instance's own label)."""
        left, top, right, bottom = self.canvas.textbbox((0, 0), text, font=self.font)
        height = bottom - top + 4
        above = top_y - height if top_y - height >= 0 else top_y
        if under:
            line = self.text_size + 6  # a label's height for any text, and a gap of 2
            above = (top_y - line if top_y - line >= 0 else top_y) + under * line
        self.canvas.rectangle(
            (left_x, above, left_x + right - left + 6, above + height), fill=DRAW_COLOUR
        )
        self.canvas.text((left_x + 3, above + 2 - top), text, fill="white", font=self.font)

    def row(self, rank: int, text: str) -> None:
        """A label on the `rank`th line from the top left (classes, a summary)."""
        self.label(text, 0, rank * (self.text_size + 8))

    def point(self, x: float, y: float) -> None:
        r = self.line_width + 1
        self.canvas.ellipse((x - r, y - r, x + r, y + r), fill=DRAW_COLOUR)

    def line(self, points: Sequence[tuple[float, float]]) -> None:
        self.canvas.line(list(points), fill=DRAW_COLOUR, width=self.line_width)

    def mask(self, covered: Any) -> None:
        """Tints the pixels where `covered` (a bool array of the picture's height x width)
        is true."""
        import numpy as np

        pixels = np.asarray(self.picture, dtype=np.float32)
        colour = np.asarray(DRAW_COLOUR, dtype=np.float32)
        pixels[covered] = pixels[covered] * (1 - MASK_OPACITY) + colour * MASK_OPACITY
        self.picture.paste(self._image_module.fromarray(pixels.astype(np.uint8)))

    def save(self, out: Path) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.picture.save(out)
