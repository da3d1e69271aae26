"""Builds the model zoo: real exporters' SavedModels with random weights, and what each model
gives when run directly in TensorFlow by the library that made it.

Runs in the exporters' own venv (`.venv-zoo`, `make zoo-venv`), not the project's: it imports
TensorFlow Model Garden, keras-hub, Keras 3 and Hugging Face transformers, and nothing of the
gateway. `tests/zoo/conftest.py` runs it and caches the result.

    .venv-zoo/bin/python tests/zoo/build.py OUT_DIR

Writes OUT_DIR/models/<name>/1/ (one SavedModel per export), OUT_DIR/images/ (PNGs and JPEGs of
several sizes and aspect ratios, two of them EXIF-rotated) and OUT_DIR/expected.json: per
model and image, the library's result (classification: every class's score; detection: boxes
in pixels of the image as a viewer shows it, scores and classes, after NMS), computed with the
preprocessing the library documents for that model (tests/zoo/classifiers.py, detectors.py).
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # the kernels serving.local runs
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")

import numpy as np
from PIL import Image, ImageOps

SEED = 26
CLASSES = 6  # detection classes of the small detectors
YOLO_SIZE = 320
MG_SIZE = 256
MIN_SCORE = 0.25  # the detection threshold the tests ask the gateway for
NMS_IOU = 0.45  # the YOLO decoder's default
MAX_CANDIDATES = 1000
MAX_DETECTIONS = 100
# The spread of a classifier's logits over its classes (standard deviation) on the first
# photo: random weights give near-uniform scores that hardly move with the input; with the
# final layer rescaled to this spread, the classes separate and a wrong preprocessing moves
# the scores far past the tests' tolerance.
LOGIT_SPREAD = 3.0


@dataclass(frozen=True)
class Photo:
    """A test image: its file, and its size as a viewer shows it."""

    name: str
    path: Path
    width: int
    height: int
    orientation: int = 1

    @property
    def data(self) -> bytes:
        return self.path.read_bytes()

    def shown(self) -> np.ndarray:
        """uint8 RGB pixels as a viewer (and the gateway) shows them: Pillow decodes, then
        ImageOps.exif_transpose, as Hugging Face's load_image does."""
        with Image.open(io.BytesIO(self.data)) as image:
            return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))

    def shown_png(self) -> io.BytesIO:
        """The shown pixels as a lossless PNG, for loaders that take a file (keras load_img)."""
        out = io.BytesIO()
        Image.fromarray(self.shown()).save(out, format="PNG")
        out.seek(0)
        return out


# name -> format, width and height as shown, EXIF orientation. JPEGs at least twice a
# classifier's 224 px are where the gateway's fast path decodes smaller (DCT scaling).
PHOTO_SPECS = {
    "square224": ("png", 224, 224, 1),
    "wide320x240": ("png", 320, 240, 1),
    "tall200x300": ("png", 200, 300, 1),
    "pano900x300": ("png", 900, 300, 1),
    "yolo320": ("png", YOLO_SIZE, YOLO_SIZE, 1),
    "photo640x480": ("jpg", 640, 480, 1),
    "photo1200x900": ("jpg", 1200, 900, 1),
    "small160x120": ("jpg", 160, 120, 1),
    "exif6_600x800": ("jpg", 600, 800, 6),  # stored 800x600, shown rotated 90° clockwise
    "exif3_800x600": ("jpg", 800, 600, 3),  # stored upside down
}
CLASSIFIER_PHOTOS = (
    "square224",
    "tall200x300",
    "pano900x300",
    "photo640x480",
    "photo1200x900",
    "small160x120",
    "exif6_600x800",
    "exif3_800x600",
)


def images(out: Path) -> dict[str, Photo]:
    """Synthetic photos: soft gradients with sensor-like noise and solid shapes (no two
    alike), the JPEGs saved at quality 90 with 4:2:0 chroma as cameras do."""
    directory = out / "images"
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    photos = {}
    for name, (fmt, width, height, orientation) in PHOTO_SPECS.items():
        w, h = (height, width) if orientation in (5, 6, 7, 8) else (width, height)  # stored
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x / w, y / h, 1 - x / w], axis=-1) * 160 + 40
        pixels = base + rng.normal(0, 12, (h, w, 3))
        for _ in range(5):
            y0, x0 = rng.integers(0, h - 20), rng.integers(0, w - 20)
            y1, x1 = y0 + rng.integers(15, h // 2), x0 + rng.integers(15, w // 2)
            pixels[y0:y1, x0:x1] = rng.integers(0, 255, 3)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        path = directory / f"{name}.{fmt}"
        if fmt == "png":
            image.save(path)
        else:
            exif = Image.Exif()
            if orientation != 1:
                exif[0x0112] = orientation
            image.save(path, quality=90, subsampling="4:2:0", exif=exif)
        photos[name] = Photo(name, path, width, height, orientation)
    return photos


def scores(vector: Any) -> list[float]:
    return [float(v) for v in np.asarray(vector, dtype=np.float64).reshape(-1)]


def softmax(logits: Any) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    e = np.exp(z - z.max())
    return e / e.sum()


def calibrate(model: Any, batch: Any) -> None:
    """Sets the moving statistics of every BatchNormalization layer to those of `batch` as it
    reaches the layer (one forward pass in training mode with momentum 0), as training would
    leave them. With random weights and fresh statistics (mean 0, variance 1), activations
    shrink layer after layer (MobileNetV3Small's final features are near 1e-10) and every
    image gets the same scores; calibrated, each layer's output has unit scale again."""
    norms = [
        layer
        for layer in model._flatten_layers()
        if type(layer).__name__.endswith("BatchNormalization") and hasattr(layer, "momentum")
    ]
    assert norms, "no BatchNormalization layers"
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    model(batch, training=True)
    for layer, momentum in zip(norms, momenta, strict=True):
        layer.momentum = momentum


def sharpen(variables: list[Any], classes: int, logits: Any) -> None:
    """Rescales the final layer (every variable whose last axis is the classes) so that the
    logits, `logits` now, spread by LOGIT_SPREAD: the logits scale with it."""
    spread = float(np.std(np.asarray(logits, dtype=np.float64)))
    factor = LOGIT_SPREAD / spread
    final = [v for v in variables if len(v.shape) and v.shape[-1] == classes]
    assert final, "no final layer found"
    for variable in final:
        value = np.asarray(variable.numpy())
        variable.assign((value * factor).astype(value.dtype))


def main(argv: list[str]) -> int:
    import classifiers
    import detectors
    import embedders
    import keypointers

    builders = {**classifiers.BUILDERS, **detectors.BUILDERS, **embedders.BUILDERS,
                **keypointers.BUILDERS}  # fmt: skip
    out = Path(argv[0])
    chosen = argv[1:] or list(builders)
    models = out / "models"
    models.mkdir(parents=True, exist_ok=True)
    photos = images(out)
    expected: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name in chosen:
        started = time.monotonic()
        expected.update(builders[name](models, photos))
        timings[name] = round(time.monotonic() - started, 1)
        print(f"zoo: built {name} in {timings[name]} s", flush=True)
    settings = {
        "min_score": MIN_SCORE,
        "nms_iou": NMS_IOU,
        "max_candidates": MAX_CANDIDATES,
        "max_detections": MAX_DETECTIONS,
    }
    document = {
        "settings": settings,
        "timings": timings,
        "images": {
            p.name: {"file": p.path.name, "width": p.width, "height": p.height}
            for p in photos.values()
        },
        "expected": expected,
    }
    (out / "expected.json").write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.modules.setdefault("build", sys.modules[__name__])
    sys.exit(main(sys.argv[1:]))
