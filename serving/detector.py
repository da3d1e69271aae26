"""A deterministic reference detector built from TensorFlow ops, with OD API TF2 signatures.

It finds solid axis-aligned rectangles painted in the palette of `serving.scenes` and returns
exactly what a TF Object Detection API export returns (the TF2 exporter, exporter_lib_v2.py in
tensorflow/models: float32 outputs, 1-based classes), so the gateway can be
tested end to end with exact expected boxes and no pretrained weights.

How it works, per image (TF has no connected-components op):
1. Per-class masks: each pixel goes to its nearest palette colour if it is within
   COLOUR_THRESHOLD of it. A "closeness" map (1 at the exact colour, 0 at the threshold)
   feeds the scores.
2. Morphological opening then closing (3x3, via max_pool) removes JPEG/noise specks and fills
   small notches on edges; both leave a clean rectangle unchanged.
3. Seeds are the top-left corners of the cleaned masks. From each seed the run lengths along
   its row and column give a first box; two more passes re-measure the extents through the
   box's middle row and column, which is robust to 1-pixel steps along JPEG edges. Run
   lengths come from cumulative sums of "not in mask" and tf.searchsorted.
4. Edge refinement: a majority vote of the mask along each edge line, then a colour test that
   puts each edge where the colour is half-way between the class colour and the local
   background (JPEG's chroma subsampling blurs edges by about a pixel).
5. Score = mean colour closeness x mask fill inside the box (without its 1-px rim) x
   (1 - class colour found 2 px outside a side), from integral images. A clean rectangle
   scores ~1, noisy or JPEG ones less, a box covering part of a region ~0.
6. Non-maximum suppression drops the duplicates that several seeds of one rectangle produce.
Steps 3 to 5 measure and score boxes with the functions of serving.boxes.

Box convention: pixel box [y0, x0, y1, x1) with max exclusive; the normalized output is
[y0/H, x0/W, y1/H, x1/W], like the OD API's [ymin, xmin, ymax, xmax].
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from serving.boxes import (
    CLOSENESS_SCALE,
    integral_images,
    line_sums,
    refine_edges_by_colour,
    refine_edges_by_mask,
    run_extent,
    score_boxes,
)
from serving.scenes import PALETTE
from serving.shapes import checked_input

NUM_CLASSES = len(PALETTE)
# Height and width of the fixed-size detector's input (SSD MobileNet's 320x320).
FIXED_SIZE = 320
# Detections per image in the outputs (the OD API's usual max_detections).
MAX_DETECTIONS = 100
# Pre-NMS candidates reported in raw_detection_boxes/raw_detection_scores (zero padded). OD API
# models report one row per anchor; this detector has no anchors, so R is a fixed choice.
RAW_DETECTIONS = 200
# Seeds measured per image. A clean scene has a handful per rectangle; the cap bounds the work
# on pathological inputs (seeds beyond it, in raster order, are ignored).
MAX_SEEDS = 2048
# A pixel belongs to a class when its RGB distance to the class colour is below this.
# Backgrounds are >= 160 away from the palette (serving.scenes.MIN_BACKGROUND_DISTANCE) and
# noise of sigma 12 rarely moves a pixel by more than 40, so 80 separates them with margin.
# JPEG-blended edge pixels may fall either side; the colour edge refinement settles those.
COLOUR_THRESHOLD = 80.0
# Candidates thinner than this (pixels) are noise; test rectangles are at least 8x8.
MIN_SIDE = 4
# Duplicates of one rectangle overlap almost completely; distinct rectangles never overlap.
NMS_IOU_THRESHOLD = 0.5
# Detections scoring below this are not reported (the rest of the 100 rows are zero padding).
MIN_SCORE = 0.05

PALETTE_RGB = tf.constant([c.rgb for c in PALETTE], dtype=tf.float32)

# Output keys and per-image shapes of the OD API TF2 exporter (all float32).
OUTPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "detection_boxes": (MAX_DETECTIONS, 4),
    "detection_scores": (MAX_DETECTIONS,),
    "detection_classes": (MAX_DETECTIONS,),
    "num_detections": (),
    "detection_multiclass_scores": (MAX_DETECTIONS, NUM_CLASSES + 1),
    "raw_detection_boxes": (RAW_DETECTIONS, 4),
    "raw_detection_scores": (RAW_DETECTIONS, NUM_CLASSES + 1),
}


def _class_maps(image: tf.Tensor, palette: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-class masks [H, W, K] (bool) and int32 fixed-point closeness [H, W, K]."""
    pixels = tf.cast(image, tf.float32)
    # |p - c|^2 = |p|^2 - 2 p.c + |c|^2 without materialising an [H, W, K, 3] difference.
    dist2 = (
        tf.reduce_sum(tf.square(pixels), axis=-1, keepdims=True)
        - 2.0 * tf.einsum("hwc,kc->hwk", pixels, palette)
        + tf.reduce_sum(tf.square(palette), axis=-1)
    )
    dist2 = tf.maximum(dist2, 0.0)
    nearest = tf.argmin(dist2, axis=-1, output_type=tf.int32)
    threshold2 = COLOUR_THRESHOLD**2
    mask = tf.logical_and(
        tf.one_hot(nearest, NUM_CLASSES, on_value=True, off_value=False, dtype=tf.bool),
        dist2 < threshold2,
    )
    # Quadratic fall-off: noise of sigma 12 costs only a few percent of the score, while pixels
    # near the threshold (JPEG blends) count little.
    closeness = tf.where(mask, 1.0 - dist2 / threshold2, 0.0)
    closeness_q = tf.cast(tf.round(closeness * CLOSENESS_SCALE), tf.int32)
    return mask, closeness_q


def _clean(mask: tf.Tensor) -> tf.Tensor:
    """Opening then closing with a 3x3 square; a rectangle at least 3 px wide is unchanged.

    Opening first removes specks and thin protrusions, so that closing cannot glue them to a
    rectangle. Erosion is -max_pool(-x). The border pixels are first repeated 4 px outwards
    (the reach of the four 3x3 steps), so a rectangle touching the border is not eroded there
    and a 1-px gap between a rectangle and the border is not closed.
    """
    height, width = tf.shape(mask)[0], tf.shape(mask)[1]
    pad = 4
    rows = tf.clip_by_value(tf.range(-pad, height + pad), 0, height - 1)
    cols = tf.clip_by_value(tf.range(-pad, width + pad), 0, width - 1)
    x = tf.gather(tf.gather(tf.cast(mask, tf.float32), rows, axis=0), cols, axis=1)

    def dilate(t: tf.Tensor) -> tf.Tensor:
        return tf.nn.max_pool2d(t, ksize=3, strides=1, padding="SAME")

    def erode(t: tf.Tensor) -> tf.Tensor:
        return -tf.nn.max_pool2d(-t, ksize=3, strides=1, padding="SAME")

    x = x[tf.newaxis]  # [1, H, W, K] for max_pool2d
    x = dilate(erode(x))
    x = erode(dilate(x))
    return x[0, pad : pad + height, pad : pad + width] > 0.5


def _pad_rows(x: tf.Tensor, rows: int) -> tf.Tensor:
    """Zero-pads (or truncates) the first dimension of `x` to exactly `rows`."""
    x = x[:rows]
    paddings = [[0, rows - tf.shape(x)[0]]] + [[0, 0]] * (len(x.shape) - 1)
    return tf.pad(x, paddings)


def class_masks(image: tf.Tensor, palette: tf.Tensor | None = None) -> tf.Tensor:
    """The cleaned per-class masks [H, W, K] (bool) of one [H, W, 3] image: the pixels within
    COLOUR_THRESHOLD of their nearest palette colour, opened and closed (steps 1 and 2 above)."""
    image = tf.convert_to_tensor(image)
    return _clean(_class_maps(image, PALETTE_RGB if palette is None else palette)[0])


def detect_image(image: tf.Tensor, palette: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
    """Runs the detector on one [H, W, 3] image; returns the OD API outputs for it.

    The image is uint8, or float32 with values 0..255 (the OD API's float_image_tensor);
    every step works on float32 pixels, so integer-valued floats give exactly the results
    of the same uint8 pixels. `palette` is the float32 [K, 3] class colours (default
    PALETTE_RGB).

    Shapes are those of OUTPUT_SHAPES (no batch dimension); everything is float32.
    """
    image = tf.convert_to_tensor(image)
    height = tf.shape(image)[0]
    width = tf.shape(image)[1]
    if palette is None:
        palette = PALETTE_RGB
    mask_raw, closeness_q = _class_maps(image, palette)
    mask = _clean(mask_raw)

    # Seeds: mask pixels with no mask pixel of the same class above or to the left.
    above = tf.pad(mask[:-1], [[1, 0], [0, 0], [0, 0]])
    left = tf.pad(mask[:, :-1], [[0, 0], [1, 0], [0, 0]])
    seeds = tf.logical_and(mask, tf.logical_not(tf.logical_or(above, left)))
    seed_idx = tf.cast(tf.where(seeds)[:MAX_SEEDS], tf.int32)  # [S, 3] = (y, x, k)
    y, x, k = tf.unstack(seed_idx, num=3, axis=1)

    rows = tf.transpose(mask, [2, 0, 1])  # [K, H, W]: rows[k, y] is row y of class k
    cols = tf.transpose(mask, [2, 1, 0])  # [K, W, H]: cols[k, x] is column x of class k

    def measure_row(y: tf.Tensor, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        return run_extent(tf.gather_nd(rows, tf.stack([k, y], axis=1)), x)

    def measure_col(y: tf.Tensor, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        return run_extent(tf.gather_nd(cols, tf.stack([k, x], axis=1)), y)

    # Pass 1: run lengths right and down from the corner.
    x0, x1, valid_row = measure_row(y, x)
    y0, y1, valid_col = measure_col(y, x)
    valid = tf.logical_and(valid_row, valid_col)
    # Passes 2 and 3: re-measure through the middle, where a notched corner cannot mislead.
    for _ in range(2):
        ym = (y0 + y1 - 1) // 2
        xm = (x0 + x1 - 1) // 2
        x0, x1, valid_row = measure_row(ym, xm)
        y0, y1, valid_col = measure_col(ym, xm)
        valid = tf.logical_and(valid, tf.logical_and(valid_row, valid_col))

    # Channels 0..K-1: closeness per class; K..2K-1: cleaned mask per class.
    integral = integral_images(tf.concat([closeness_q, tf.cast(mask, tf.int32)], axis=2))
    box = (y0, x0, y1, x1)
    for _ in range(2):
        box = refine_edges_by_mask(integral, k + NUM_CLASSES, box)
    along_rows, along_cols = line_sums(tf.cast(image, tf.float32))
    colour = tf.gather(palette, k)
    for _ in range(2):
        box = refine_edges_by_colour(along_rows, along_cols, colour, box)
    y0, x0, y1, x1 = box
    valid = tf.logical_and(valid, tf.logical_and(y1 - y0 >= MIN_SIDE, x1 - x0 >= MIN_SIDE))
    scores = tf.where(valid, score_boxes(integral, k, k + NUM_CLASSES, box), 0.0)
    pixel_boxes = tf.stack(box, axis=1)
    size = tf.cast(tf.stack([height, width, height, width]), tf.float32)
    boxes = tf.cast(pixel_boxes, tf.float32) / size
    classes = k + 1  # label map ids are 1-based

    def multiclass(scores: tf.Tensor, classes: tf.Tensor) -> tf.Tensor:
        # Background (index 0) gets the rest of the probability mass.
        onehot = tf.one_hot(classes, NUM_CLASSES + 1, dtype=tf.float32)
        background = tf.one_hot(tf.zeros_like(classes), NUM_CLASSES + 1, dtype=tf.float32)
        return onehot * scores[:, tf.newaxis] + background * (1.0 - scores[:, tf.newaxis])

    # Raw (pre-NMS) candidates: the best RAW_DETECTIONS, sorted by score.
    raw_top = tf.math.top_k(scores, k=tf.minimum(RAW_DETECTIONS, tf.shape(scores)[0]))
    raw_boxes = tf.gather(boxes, raw_top.indices)
    raw_scores = multiclass(raw_top.values, tf.gather(classes, raw_top.indices))

    selected = tf.image.non_max_suppression(
        boxes,
        scores,
        max_output_size=MAX_DETECTIONS,
        iou_threshold=NMS_IOU_THRESHOLD,
        score_threshold=MIN_SCORE,
    )
    det_scores = tf.gather(scores, selected)
    det_classes = tf.gather(classes, selected)
    return {
        "detection_boxes": _pad_rows(tf.gather(boxes, selected), MAX_DETECTIONS),
        "detection_scores": _pad_rows(det_scores, MAX_DETECTIONS),
        "detection_classes": _pad_rows(tf.cast(det_classes, tf.float32), MAX_DETECTIONS),
        "num_detections": tf.cast(tf.shape(selected)[0], tf.float32),
        "detection_multiclass_scores": _pad_rows(
            multiclass(det_scores, det_classes), MAX_DETECTIONS
        ),
        "raw_detection_boxes": _pad_rows(raw_boxes, RAW_DETECTIONS),
        "raw_detection_scores": _pad_rows(raw_scores, RAW_DETECTIONS),
    }


def detect_batch(images: tf.Tensor, palette: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
    """Runs detect_image over a [B, H, W, 3] batch (uint8 or float32), whatever B is at
    run time.

    TF Serving does not check request shapes, so a batch of 2 can reach a [1, H, W, 3]
    signature. tf.map_fn over `images` would trust the static batch size and silently process
    only the first image, so the loop runs over a tf.range of the run-time batch size. The
    outputs keep the declared batch size as their static shape, as OD API signatures do
    ((1, 100, 4)).
    """
    signature = {key: tf.TensorSpec(shape, tf.float32) for key, shape in OUTPUT_SHAPES.items()}
    # Reshaping to [-1, H, W, 3] hides the static batch size from constant folding, which
    # would otherwise turn tf.shape(images)[0] into the declared 1.
    dynamic = tf.reshape(images, tf.concat([[-1], tf.shape(images)[1:]], axis=0))
    indices = tf.range(tf.shape(dynamic)[0])
    result: dict[str, tf.Tensor] = tf.map_fn(
        lambda i: detect_image(dynamic[i], palette), indices, fn_output_signature=signature
    )
    for key, value in result.items():
        value.set_shape([images.shape[0], *OUTPUT_SHAPES[key]])
    return result


def _decode(encoded: tf.Tensor) -> tf.Tensor:
    # Same decoding as the OD API's encoded_image_string_tensor input: 3 channels, first frame.
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False, dtype=tf.uint8)
    image.set_shape([None, None, 3])
    return image


def _init_weights(module: tf.Module, version: int) -> None:
    """The model's "weights": its class colours, plus the version it was exported as.

    Reading a variable makes the serving function stateful, so its outputs are named
    StatefulPartitionedCall:<k> like those of real OD API exports.
    """
    module.palette = tf.Variable(PALETTE_RGB, trainable=False, name="palette")
    # Lets a loaded SavedModel tell versions apart; the detection graph is the same.
    module.model_version = tf.Variable(version, dtype=tf.int64, trainable=False, name="version")


class ImageTensorDetector(tf.Module):
    """The OD API `image_tensor` flavour: input_tensor is uint8 [1, None, None, 3]."""

    def __init__(self, version: int = 1) -> None:
        super().__init__(name="image_tensor_detector")
        _init_weights(self, version)

    @tf.function(input_signature=[tf.TensorSpec([1, None, None, 3], tf.uint8, name="input_tensor")])
    def __call__(self, input_tensor: tf.Tensor) -> dict[str, Any]:
        return detect_batch(input_tensor, self.palette)


class EncodedImageDetector(tf.Module):
    """The OD API `encoded_image_string_tensor` flavour: input_tensor is string [None].

    Each element is JPEG/PNG/GIF/BMP bytes; like the OD API, all images of one batch must
    decode to the same size (they are stacked into one uint8 batch).
    """

    def __init__(self, version: int = 1) -> None:
        super().__init__(name="encoded_image_detector")
        _init_weights(self, version)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="input_tensor")])
    def __call__(self, input_tensor: tf.Tensor) -> dict[str, Any]:
        images = tf.map_fn(
            _decode, input_tensor, fn_output_signature=tf.TensorSpec([None, None, 3], tf.uint8)
        )
        return detect_batch(images, self.palette)


class FixedSizeDetector(tf.Module):
    """`image_tensor` exported with a fixed size: input_tensor is uint8 [1, 320, 320, 3].

    Like a model exported for one input size (SSD MobileNet 320x320), it serves only that
    size: clients resize. Another height, width or channel count fails with INVALID_ARGUMENT
    from the model's own shape check (serving.shapes; TF Serving checks no shapes). A batch
    of more than one image runs, as with `detector`.
    """

    SHAPE = (1, FIXED_SIZE, FIXED_SIZE, 3)

    def __init__(self, version: int = 1) -> None:
        super().__init__(name="fixed_size_detector")
        _init_weights(self, version)

    @tf.function(input_signature=[tf.TensorSpec(SHAPE, tf.uint8, name="input_tensor")])
    def __call__(self, input_tensor: tf.Tensor) -> dict[str, Any]:
        images = checked_input(input_tensor, "input_tensor", (None, FIXED_SIZE, FIXED_SIZE, 3))
        result = detect_batch(images, self.palette)
        for key, value in result.items():
            value.set_shape([1, *OUTPUT_SHAPES[key]])  # the declared batch, as OD API exports
        return result


class FloatImageDetector(tf.Module):
    """The OD API `float_image_tensor` flavour: input_tensor is float32 [1, None, None, 3]
    with values 0..255 (not normalised; the model's own preprocessing would do that)."""

    def __init__(self, version: int = 1) -> None:
        super().__init__(name="float_image_detector")
        _init_weights(self, version)

    @tf.function(
        input_signature=[tf.TensorSpec([1, None, None, 3], tf.float32, name="input_tensor")]
    )
    def __call__(self, input_tensor: tf.Tensor) -> dict[str, Any]:
        return detect_batch(input_tensor, self.palette)
