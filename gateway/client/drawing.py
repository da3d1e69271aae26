"""`--draw`: the image with its detections' boxes and labels, or its top classes, drawn on
it (Pillow; imported only when drawing)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

# Boxes and label backgrounds in this colour, label text in white.
DRAW_COLOUR = (255, 0, 255)


def draw(image: bytes, result: dict[str, Any], out: Path) -> None:
    """Writes the image (as a viewer shows it: EXIF orientation applied, like the gateway's
    pixels) with the detections' boxes, labels and scores, or the top classes, drawn on it."""
    from PIL import Image, ImageDraw, ImageFont, ImageOps

    picture = ImageOps.exif_transpose(Image.open(io.BytesIO(image))).convert("RGB")
    canvas = ImageDraw.Draw(picture)
    size = max(12, picture.width // 50)
    font = ImageFont.load_default(size)
    line = max(2, picture.width // 320)

    def label(text: str, left_x: int, top_y: int) -> None:
        left, top, right, bottom = canvas.textbbox((0, 0), text, font=font)
        height = bottom - top + 4
        above = top_y - height if top_y - height >= 0 else top_y
        canvas.rectangle(
            (left_x, above, left_x + right - left + 6, above + height), fill=DRAW_COLOUR
        )
        canvas.text((left_x + 3, above + 2 - top), text, fill="white", font=font)

    detections = result.get("detections", [])
    for detection in detections:
        box = detection["box"]
        canvas.rectangle(
            (box["x_min"], box["y_min"], box["x_max"] - 1, box["y_max"] - 1),
            outline=DRAW_COLOUR,
            width=line,
        )
    for detection in detections:
        box = detection["box"]
        label(f"{detection['label']} {detection['score']:.2f}", box["x_min"], box["y_min"])
    for rank, scored in enumerate(result.get("classes", [])):
        label(f"{scored['label']} {scored['score']:.3f}", 0, rank * (size + 8))
    out.parent.mkdir(parents=True, exist_ok=True)
    picture.save(out)


def draw_path(out: Path, index: int, count: int) -> Path:
    """OUT.png for one image; OUT-0.png, OUT-1.png, ... for several."""
    return out if count == 1 else out.with_name(f"{out.stem}-{index}{out.suffix}")
