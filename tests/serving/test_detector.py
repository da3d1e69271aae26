"""The exported reference detectors find every generated rectangle, exactly, and nothing else.

Runs the real SavedModels (loaded with TensorFlow from the session `model_repo`) on scenes from
serving.scenes: random sizes 64..2000 px, 0..12 rectangles, plain and noisy backgrounds, PNG
and JPEG quality 90.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from serving import detector, scenes

Outputs = dict[str, np.ndarray]
Model = Callable[[np.ndarray], Outputs]

# A box edge may be off by this many pixels (JPEG blurs edges); scores above this threshold
# count as detections.
BOX_TOLERANCE_PX = 1
DETECTION_THRESHOLD = 0.5


def _load(model_repo: Path, name: str) -> Model:
    signature = tf.saved_model.load(str(model_repo / name / "1")).signatures["serving_default"]

    def run(batch: np.ndarray) -> Outputs:
        return {k: v.numpy() for k, v in signature(input_tensor=tf.constant(batch)).items()}

    return run


@pytest.fixture(scope="module")
def image_model(model_repo: Path) -> Model:
    """The `detector` model: uint8 [1, H, W, 3] in."""
    return _load(model_repo, "detector")


@pytest.fixture(scope="module")
def encoded_model(model_repo: Path) -> Model:
    """The `detector_encoded` model: string [N] of image bytes in."""
    return _load(model_repo, "detector_encoded")


def _encoded_batch(*images: bytes) -> np.ndarray:
    return np.array(images, dtype=object)


def _pixel_boxes(outputs: Outputs, index: int, height: int, width: int) -> np.ndarray:
    """The valid detection boxes of batch item `index` in pixels, [n, 4] (y0, x0, y1, x1)."""
    n = int(outputs["num_detections"][index])
    return outputs["detection_boxes"][index, :n] * np.array([height, width, height, width])


def _assert_finds_exactly(
    scene: scenes.Scene, outputs: Outputs, index: int = 0, tolerance: int = BOX_TOLERANCE_PX
) -> np.ndarray:
    """Every ground-truth box is detected with its class and a box within `tolerance` px;
    every other detection scores at most DETECTION_THRESHOLD. Returns the matches' scores."""
    n = int(outputs["num_detections"][index])
    boxes = _pixel_boxes(outputs, index, scene.height, scene.width)
    classes = outputs["detection_classes"][index, :n].astype(int)
    scores = outputs["detection_scores"][index, :n]
    matched: list[int] = []
    for truth in scene.boxes:
        expected = np.array([truth.y_min, truth.x_min, truth.y_max, truth.x_max])
        hits = [
            i
            for i in range(n)
            if classes[i] == truth.class_id
            and np.abs(boxes[i] - expected).max() <= tolerance + 1e-3
        ]
        assert hits, f"{truth} not found; detections: {boxes.round(1).tolist()} {classes}"
        assert scores[hits[0]] > DETECTION_THRESHOLD, f"{truth} scores only {scores[hits[0]]}"
        matched.append(hits[0])
    extra = [(classes[i], boxes[i].round(1), scores[i]) for i in range(n) if i not in matched]
    assert all(score <= DETECTION_THRESHOLD for _, _, score in extra), f"spurious: {extra}"
    return scores[matched]


def _assert_well_formed(outputs: Outputs) -> None:
    """OD API conventions: sorted scores, 1-based classes, zero padding after num_detections."""
    for b, count in enumerate(outputs["num_detections"]):
        n = int(count)
        assert count == n and 0 <= n <= detector.MAX_DETECTIONS
        scores = outputs["detection_scores"][b]
        assert np.all(np.diff(scores[:n]) <= 0), "scores must be sorted descending"
        assert np.all((scores[:n] > 0) & (scores[:n] <= 1))
        classes = outputs["detection_classes"][b, :n]
        assert set(classes.tolist()) <= {float(c.class_id) for c in scenes.PALETTE}
        boxes = outputs["detection_boxes"][b, :n]
        assert np.all((boxes >= 0) & (boxes <= 1))
        assert np.all(boxes[:, 2:] > boxes[:, :2])
        for key in (
            "detection_boxes",
            "detection_scores",
            "detection_classes",
            "detection_multiclass_scores",
        ):
            assert not np.any(outputs[key][b, n:]), f"{key} is not zero-padded after {n}"
        # Multiclass scores: background at index 0, the detected class at its id.
        multiclass = outputs["detection_multiclass_scores"][b, :n]
        np.testing.assert_allclose(multiclass[np.arange(n), classes.astype(int)], scores[:n])
        np.testing.assert_allclose(multiclass.sum(axis=1), 1.0, rtol=1e-5)
        # Raw candidates: one class column (plus background) per row, sorted by that score.
        raw_scores = outputs["raw_detection_scores"][b, :, 1:].sum(axis=1)
        assert np.all(np.diff(raw_scores) <= 0)


def _random_case(seed: int) -> tuple[int, int, int, float]:
    """(width, height, rectangles, noise sigma) drawn from `seed`."""
    rng = np.random.default_rng(seed)
    width, height = (int(v) for v in rng.integers(64, 2001, size=2))
    return width, height, int(rng.integers(0, 13)), float(rng.choice([0.0, 6.0, 12.0]))


# 24 seeds x (PNG, JPEG): sizes, counts and noise levels are spread over the whole range.
RANDOM_SEEDS = range(100, 124)
# Corner cases the random draw might miss: the size extremes, crowded scenes, no rectangles.
FIXED_CASES = [
    pytest.param(1, 64, 64, 12, 12.0, id="64x64-crowded-noisy"),
    pytest.param(2, 2000, 2000, 12, 12.0, id="2000x2000-noisy"),
    pytest.param(3, 2000, 64, 12, 0.0, id="2000x64-strip"),
    pytest.param(4, 300, 200, 0, 12.0, id="no-rectangles-noisy"),
]


def _check_scene(scene: scenes.Scene, fmt: str, image_model: Model, encoded_model: Model) -> None:
    if fmt == "PNG":
        # PNG is lossless: send it encoded, so the in-graph decoder is exercised too.
        outputs = encoded_model(_encoded_batch(scenes.encode(scene.pixels, "PNG")))
    else:
        # JPEG: decode like a client (Pillow/libjpeg) and send uint8 pixels.
        decoded = scenes.decode(scenes.encode(scene.pixels, "JPEG", quality=90))
        outputs = image_model(decoded[np.newaxis])
    _assert_well_formed(outputs)
    # Without noise or JPEG there is no excuse for any error.
    exact = fmt == "PNG" and scene.noise_sigma == 0
    _assert_finds_exactly(scene, outputs, tolerance=0 if exact else BOX_TOLERANCE_PX)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_scene_rectangles_are_found_within_one_pixel(
    seed: int, fmt: str, image_model: Model, encoded_model: Model
) -> None:
    width, height, n_rects, sigma = _random_case(seed)
    scene = scenes.generate_scene(np.random.default_rng(seed), width, height, n_rects, sigma)
    _check_scene(scene, fmt, image_model, encoded_model)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize(("seed", "width", "height", "n_rects", "sigma"), FIXED_CASES)
def test_corner_case_scenes_are_found_within_one_pixel(
    seed: int,
    width: int,
    height: int,
    n_rects: int,
    sigma: float,
    fmt: str,
    image_model: Model,
    encoded_model: Model,
) -> None:
    scene = scenes.generate_scene(np.random.default_rng(seed), width, height, n_rects, sigma)
    _check_scene(scene, fmt, image_model, encoded_model)


def test_jpeg_decoded_in_graph_is_found_within_one_pixel(encoded_model: Model) -> None:
    # TF's in-graph JPEG decoder may differ slightly from Pillow's; both must work.
    scene = scenes.generate_scene(np.random.default_rng(7), 900, 700, 10, noise_sigma=8.0)
    outputs = encoded_model(_encoded_batch(scenes.encode(scene.pixels, "JPEG", quality=90)))
    _assert_well_formed(outputs)
    _assert_finds_exactly(scene, outputs)


def test_rectangles_touching_every_border_are_exact(image_model: Model) -> None:
    pixels = np.full((120, 160, 3), (128, 128, 128), dtype=np.uint8)
    red, green, blue, yellow = (c.rgb for c in scenes.PALETTE)
    pixels[0:30, 0:40] = red  # top-left corner
    pixels[90:120, 120:160] = green  # bottom-right corner
    pixels[0:20, 60:100] = blue  # top edge
    pixels[50:80, 0:8] = yellow  # left edge, minimum width
    outputs = image_model(pixels[np.newaxis])
    found = sorted(
        (int(c), *np.rint(box).astype(int).tolist())
        for c, box in zip(
            outputs["detection_classes"][0],
            _pixel_boxes(outputs, 0, 120, 160),
            strict=False,
        )
    )
    assert found == [
        (1, 0, 0, 30, 40),
        (2, 90, 120, 120, 160),
        (3, 0, 60, 20, 100),
        (4, 50, 0, 80, 8),
    ]
    np.testing.assert_allclose(outputs["detection_scores"][0, :4], 1.0, atol=1e-3)


@pytest.mark.parametrize(("fmt", "tolerance"), [("PNG", 0), ("JPEG", BOX_TOLERANCE_PX)])
def test_thin_background_gaps_at_the_border_are_kept(
    fmt: str, tolerance: int, image_model: Model
) -> None:
    # Closing the mask must not swallow a 1-2 px strip of background at the image border.
    background = (90, 110, 130)
    pixels = np.full((100, 140, 3), background, dtype=np.uint8)
    truth = [
        scenes.GroundTruthBox(1, "red_box", 20, 1, 50, 30),  # 1 px below the top
        scenes.GroundTruthBox(2, "green_box", 2, 40, 30, 70),  # 2 px right of the left
        scenes.GroundTruthBox(3, "blue_box", 100, 10, 139, 40),  # 1 px left of the right
        scenes.GroundTruthBox(4, "yellow_box", 60, 60, 90, 98),  # 2 px above the bottom
    ]
    rgb = {c.class_id: c.rgb for c in scenes.PALETTE}
    for box in truth:
        pixels[box.y_min : box.y_max, box.x_min : box.x_max] = rgb[box.class_id]
    scene = scenes.Scene(pixels=pixels, boxes=truth, background=background)
    if fmt == "JPEG":
        pixels = scenes.decode(scenes.encode(pixels, "JPEG", quality=90))
    outputs = image_model(pixels[np.newaxis])
    assert outputs["num_detections"][0] == len(truth)
    _assert_finds_exactly(scene, outputs, tolerance=tolerance)


def test_clean_png_scores_near_one_and_degraded_copies_score_lower(image_model: Model) -> None:
    rng = np.random.default_rng(11)
    clean = scenes.generate_scene(rng, 640, 480, 8, noise_sigma=0.0)
    noisy = scenes.Scene(
        pixels=np.clip(clean.pixels + rng.normal(0, 12, clean.pixels.shape), 0, 255).astype(
            np.uint8
        ),
        boxes=clean.boxes,
    )
    jpeg = scenes.decode(scenes.encode(clean.pixels, "JPEG", quality=90))
    clean_scores = _assert_finds_exactly(clean, image_model(clean.pixels[np.newaxis]))
    noisy_scores = _assert_finds_exactly(noisy, image_model(noisy.pixels[np.newaxis]))
    jpeg_scores = _assert_finds_exactly(clean, image_model(jpeg[np.newaxis]))
    assert np.all(clean_scores > 0.99)
    # The score measures how clean a rectangle is: lower, but still confident.
    assert np.all(noisy_scores < clean_scores) and np.all(noisy_scores > 0.8)
    # JPEG q90 keeps the inside of a rectangle almost exact, so some may still score 1.
    assert np.all(jpeg_scores <= clean_scores) and jpeg_scores.mean() < clean_scores.mean()
    assert np.all(jpeg_scores > 0.7)


def test_encoded_model_matches_image_model_on_png(image_model: Model, encoded_model: Model) -> None:
    for seed, (width, height, n_rects, sigma) in [(21, (500, 375, 9, 6.0)), (22, (64, 90, 3, 0))]:
        scene = scenes.generate_scene(np.random.default_rng(seed), width, height, n_rects, sigma)
        from_pixels = image_model(scene.pixels[np.newaxis])
        from_png = encoded_model(_encoded_batch(scenes.encode(scene.pixels, "PNG")))
        assert from_pixels.keys() == from_png.keys()
        for key, value in from_pixels.items():
            np.testing.assert_array_equal(from_png[key], value, err_msg=key)


def test_any_batch_size_is_handled(image_model: Model, encoded_model: Model) -> None:
    # TF Serving does not check shapes, so a batch of 2 reaches the [1, H, W, 3] signature.
    rng = np.random.default_rng(31)
    batch = [scenes.generate_scene(rng, 200, 150, 4, noise_sigma=4.0) for _ in range(2)]
    from_pixels = image_model(np.stack([s.pixels for s in batch]))
    from_png = encoded_model(_encoded_batch(*(scenes.encode(s.pixels) for s in batch)))
    for outputs in (from_pixels, from_png):
        assert outputs["detection_boxes"].shape == (2, detector.MAX_DETECTIONS, 4)
        assert outputs["raw_detection_scores"].shape == (
            2,
            detector.RAW_DETECTIONS,
            detector.NUM_CLASSES + 1,
        )
        _assert_well_formed(outputs)
        for index, scene in enumerate(batch):
            _assert_finds_exactly(scene, outputs, index)
    empty = image_model(np.zeros((0, 32, 32, 3), dtype=np.uint8))
    assert empty["detection_boxes"].shape == (0, detector.MAX_DETECTIONS, 4)


def test_encoded_batch_of_different_sizes_is_rejected_like_od_api(encoded_model: Model) -> None:
    # The OD API stacks the decoded images into one uint8 batch, so they must match in size.
    small, large = (np.full((h, 48, 3), 128, dtype=np.uint8) for h in (32, 40))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Incompatible shapes"):
        encoded_model(_encoded_batch(scenes.encode(small), scenes.encode(large)))


def test_image_without_rectangles_has_no_detections(image_model: Model) -> None:
    scene = scenes.generate_scene(np.random.default_rng(41), 320, 240, 0, noise_sigma=12.0)
    outputs = image_model(scene.pixels[np.newaxis])
    assert outputs["num_detections"].tolist() == [0.0]
    assert not np.any(outputs["detection_boxes"]) and not np.any(outputs["raw_detection_boxes"])


def test_raw_detections_hold_every_final_detection(image_model: Model) -> None:
    scene = scenes.generate_scene(np.random.default_rng(51), 400, 300, 6, noise_sigma=6.0)
    outputs = image_model(scene.pixels[np.newaxis])
    n = int(outputs["num_detections"][0])
    raw_boxes = outputs["raw_detection_boxes"][0]
    raw_scores = outputs["raw_detection_scores"][0]
    for box, score, cls in zip(
        outputs["detection_boxes"][0, :n],
        outputs["detection_scores"][0, :n],
        outputs["detection_classes"][0, :n],
        strict=True,
    ):
        same = np.all(raw_boxes == box, axis=1) & (raw_scores[:, int(cls)] == score)
        assert same.any()


@pytest.mark.parametrize("fmt", ["GIF", "BMP"])
def test_gif_and_bmp_are_decoded_in_graph(fmt: str, encoded_model: Model) -> None:
    # Plain scenes have few colours, so even GIF's 256-colour palette keeps them exact.
    scene = scenes.generate_scene(np.random.default_rng(61), 240, 180, 5, noise_sigma=0.0)
    buffer = io.BytesIO()
    Image.fromarray(scene.pixels).save(buffer, format=fmt)
    outputs = encoded_model(_encoded_batch(buffer.getvalue()))
    scores = _assert_finds_exactly(scene, outputs)
    assert np.all(scores > 0.99)


@pytest.mark.parametrize(("height", "width"), [(1, 1), (3, 3), (2, 50), (8, 8)])
def test_tiny_images_and_image_filling_rectangles(
    height: int, width: int, image_model: Model
) -> None:
    # Whole image one palette colour: a rectangle if it is big enough, else nothing (no crash).
    pixels = np.full((1, height, width, 3), scenes.PALETTE[0].rgb, dtype=np.uint8)
    outputs = image_model(pixels)
    _assert_well_formed(outputs)
    if min(height, width) >= detector.MIN_SIDE:
        assert outputs["num_detections"].tolist() == [1.0]
        np.testing.assert_array_equal(outputs["detection_boxes"][0, 0], [0, 0, 1, 1])
    else:
        assert outputs["num_detections"].tolist() == [0.0]
