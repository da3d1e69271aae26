"""The pipelines' end-to-end setup (tests/e2e/test_pipelines*.py): the gateway's example
model config (serving/gateway-models.toml, with `detect_then_classify`) plus pipelines for the
per-crop rules and failures, and the scene they run on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serving import scenes

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = ROOT / "serving" / "gateway-models.toml"
PIPELINE = "detect_then_classify"
EXTRA = """
[pipelines.only_red]
detect = "detector"
[[pipelines.only_red.steps]]
name = "colour"
model = "classifier_scores"
labels = ["red box"]
min_size = 30
max_crops = 1
padding = 0.25

[pipelines.missing_step]
detect = "detector"
[[pipelines.missing_step.steps]]
name = "colour"
model = "no_such_model"

[pipelines.missing_required]
detect = "detector"
[[pipelines.missing_required.steps]]
name = "colour"
model = "no_such_model"
required = true
"""


def write_config(path: Path) -> Path:
    """The example config with EXTRA, its label paths made absolute; returns `path`."""
    text = MODEL_CONFIG.read_text().replace('label_map = "', f'label_map = "{MODEL_CONFIG.parent}/')
    text = text.replace('labels = "', f'labels = "{MODEL_CONFIG.parent}/')
    path.write_text(text + EXTRA)
    return path


def scene(seed: int = 3) -> scenes.Scene:
    """Six rectangles on a noisy 640x480 background."""
    return scenes.generate_scene(np.random.default_rng(seed), 640, 480, 6, noise_sigma=4.0)


DATASET_SEEDS = (3, 4, 5)


def write_dataset(directory: Path) -> Path:
    """scene-<seed>.png for each of DATASET_SEEDS (in that order by name); returns it."""
    for seed in DATASET_SEEDS:
        (directory / f"scene-{seed}.png").write_bytes(scenes.encode(scene(seed).pixels, "PNG"))
    return directory
