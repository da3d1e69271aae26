"""Batching end to end against the local TF Serving (real TensorFlow models): a batch gives
every image the answer it gets alone.

- `free_detector`: the reference detector exported with a free batch ([-1,-1,-1,3]), called
  natively (one image per call, at its own size) and, as `letterboxed` (the same SavedModel),
  letterboxed on a 480x480 canvas (`input.pad_to`) in one batch of images of mixed sizes and
  EXIF orientations: the same boxes within 1 px.
- `classifier_scores` (float32 [-1,224,224,3]) alone and, as `scores_batched`, in one batch.

`max_delay_ms` is long and `max_batch` the number of images, so the images wait for each
other and go as one call: the test waits for that event, not for time.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gateway import metrics, modelcheck, policy
from gateway.app import built_in_tasks
from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.domain import Outcome
from gateway.models import ModelRegistry, load_registry
from gateway.upstream.client import TFServingClient
from serving import scenes
from tests.support.localserver import LocalServer, run_local_server
from tests.support.pipelines import classify, detect

ROOT = Path(__file__).resolve().parents[2]
# (width, height, EXIF orientation) of the detector's images: smaller and larger than the
# canvas, portrait and landscape, turned by EXIF.
SHAPES = [(320, 240, 1), (240, 360, 6), (520, 300, 3), (200, 200, 1), (640, 400, 8), (300, 450, 5)]
CANVAS = 480
COLOURS = [(250, 10, 10), (10, 240, 10), (10, 10, 250), (250, 250, 10), (10, 250, 250)]

GATEWAY_CONFIG = f"""
[models.detector]
task = "detection"

[models.free_detector]
task = "detection"
label_map = "{ROOT / "serving" / "label_map.pbtxt"}"
[models.free_detector.batching]
enabled = false

[models.letterboxed]
task = "detection"
label_map = "{ROOT / "serving" / "label_map.pbtxt"}"
[models.letterboxed.input]
pad_to = [{CANVAS}, {CANVAS}]
[models.letterboxed.batching]
max_batch = {len(SHAPES)}
max_delay_ms = 1000

[models.classifier_scores]
task = "classification"
labels = "{ROOT / "serving" / "labels.txt"}"
top_k = 8
[models.classifier_scores.input]
scale = 0.00392156862745098
[models.classifier_scores.batching]
enabled = false

[models.scores_batched]
task = "classification"
labels = "{ROOT / "serving" / "labels.txt"}"
top_k = 8
[models.scores_batched.input]
scale = 0.00392156862745098
[models.scores_batched.batching]
max_batch = {len(COLOURS)}
max_delay_ms = 1000
"""


def export_free_detector(path: Path) -> None:
    import tensorflow as tf

    from serving.detector import PALETTE_RGB, detect_batch

    class FreeBatchDetector(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.palette = tf.Variable(PALETTE_RGB, trainable=False)

        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)])
        def __call__(self, input_tensor: tf.Tensor) -> dict[str, tf.Tensor]:
            return detect_batch(input_tensor, self.palette)

    module = FreeBatchDetector()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})


@pytest.fixture(scope="module")
def tfs(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("batching-models")
    export_free_detector(root / "free_detector" / "1")
    paths = {
        "detector": model_repo / "detector",
        "free_detector": root / "free_detector",
        "letterboxed": root / "free_detector",
        "classifier_scores": model_repo / "classifier_scores",
        "scores_batched": model_repo / "classifier_scores",
    }
    entries = "".join(
        f"  config {{ name: '{name}' base_path: '{path}' model_platform: 'tensorflow' }}\n"
        for name, path in paths.items()
    )
    config = root / "models.config"
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={config}"]) as server:
        yield server


def registry(tmp: Path) -> ModelRegistry:
    (tmp / "models.toml").write_text(GATEWAY_CONFIG)
    return load_registry(
        tmp / "models.toml", "free_detector", tasks=built_in_tasks().config_readers
    )


@asynccontextmanager
async def pipeline(target: str, tmp: Path) -> AsyncIterator[Pipeline]:
    settings = Settings(upstream=target)
    tasks = built_in_tasks()
    models = registry(tmp)
    client = TFServingClient(settings)
    with ThreadPoolExecutor(2) as executor:
        try:
            yield Pipeline(
                settings, client, models, executor, tasks, policy.build(settings, models)
            )
        finally:
            await client.close()


def batch_count(model: str) -> tuple[float, float]:
    labels = {"model": model}
    name = "vision_gateway_upstream_batch_size"
    count = metrics.REGISTRY.get_sample_value(name + "_count", labels) or 0.0
    total = metrics.REGISTRY.get_sample_value(name + "_sum", labels) or 0.0
    return count, total


# Inverse of the transposition ImageOps.exif_transpose applies for each orientation.
_UNDO = {
    1: None,
    3: Image.Transpose.ROTATE_180,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    8: Image.Transpose.ROTATE_270,
}


def photo(seed: int, width: int, height: int, orientation: int) -> bytes:
    """A scene shown as width x height, stored turned with its EXIF orientation (JPEG)."""
    scene = scenes.generate_scene(np.random.default_rng(seed), width, height, 4, min_side=16)
    shown = Image.fromarray(scene.pixels)
    undo = _UNDO[orientation]
    stored = shown if undo is None else shown.transpose(undo)
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    stored.save(out, format="JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def boxes(outcome: Outcome) -> list[tuple[int, int, int, int, int]]:
    return sorted(
        (d.class_id, d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max)
        for d in outcome.result.detections
        if d.score >= 0.5
    )


def test_a_letterboxed_batch_of_mixed_sizes_finds_the_boxes_each_image_finds_alone(
    tfs: LocalServer, tmp_path: Path
) -> None:
    images = [photo(i, *shape) for i, shape in enumerate(SHAPES)]

    async def scenario() -> tuple[list[Outcome], list[Outcome]]:
        async with pipeline(tfs.target, tmp_path) as p:
            alone = [await p.run("detection", detect(image, "free_detector")) for image in images]
            batched = await asyncio.gather(
                *(p.run("detection", detect(image, "letterboxed")) for image in images)
            )
            return alone, list(batched)

    before = batch_count("letterboxed")
    alone, batched = asyncio.run(scenario())
    count, total = batch_count("letterboxed")
    assert (count - before[0], total - before[1]) == (1, len(SHAPES))  # one call, every image
    for shape, one, many in zip(SHAPES, alone, batched, strict=True):
        assert (many.image_width, many.image_height) == shape[:2]
        expected, got = boxes(one), boxes(many)
        assert len(expected) >= 2 and len(got) == len(expected), (shape, expected, got)
        for e, g in zip(expected, got, strict=True):
            off = max(abs(a - b) for a, b in zip(e[1:], g[1:], strict=True))
            assert e[0] == g[0] and off <= 1, (shape, expected, got)


def test_a_batch_of_classifications_scores_each_image_as_it_scores_alone(
    tfs: LocalServer, tmp_path: Path
) -> None:
    images = []
    for i, colour in enumerate(COLOURS):
        pixels = np.zeros((100 + 10 * i, 150, 3), np.uint8)
        pixels[:] = colour
        pixels[: 30 + 5 * i] = (255, 255, 255)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="PNG")
        images.append(out.getvalue())

    async def scenario() -> tuple[list[Outcome], list[Outcome]]:
        async with pipeline(tfs.target, tmp_path) as p:
            alone = [
                await p.run("classification", classify(image, "classifier_scores"))
                for image in images
            ]
            batched = await asyncio.gather(
                *(p.run("classification", classify(image, "scores_batched")) for image in images)
            )
            return alone, list(batched)

    before = batch_count("scores_batched")
    alone, batched = asyncio.run(scenario())
    count, total = batch_count("scores_batched")
    assert (count - before[0], total - before[1]) == (1, len(COLOURS))
    for one, many in zip(alone, batched, strict=True):
        assert [c.label for c in many.result.classes] == [c.label for c in one.result.classes]
        np.testing.assert_allclose(
            [c.score for c in many.result.classes], [c.score for c in one.result.classes], atol=1e-6
        )


def test_check_models_says_which_models_batch_and_why(tfs: LocalServer, tmp_path: Path) -> None:
    settings = Settings(upstream=tfs.target)
    reports, _ = asyncio.run(modelcheck.check(settings, registry(tmp_path), built_in_tasks()))
    plans = {r.model: r.batching for r in reports}
    assert all(r.ok for r in reports), [r.error for r in reports]
    assert plans["detector"] == {
        "enabled": False,
        "why": "the signature fixes the batch of input 'input_tensor' (DT_UINT8 [1,-1,-1,3]); "
        "only a free batch dimension (-1) can take several images",
    }
    assert plans["free_detector"] == {
        "enabled": False,
        "why": "batching.enabled = false in the model config",
    }
    letterboxed = plans["letterboxed"]
    assert letterboxed is not None
    assert (letterboxed["enabled"], letterboxed["max_batch"], letterboxed["max_delay_ms"]) == (
        True,
        len(SHAPES),
        1000.0,
    )
    assert "letterboxed on the pad_to canvas" in str(letterboxed["why"])
    assert plans["scores_batched"] is not None and plans["scores_batched"]["enabled"] is True
    text = modelcheck.render(next(r for r in reports if r.model == "letterboxed"))
    assert "  batch plan: enabled = True, max_batch = 6, max_delay_ms = 1000.0, why = " in text
    assert "pad_to = 480x480 (letterbox, pad value 0)" in text
