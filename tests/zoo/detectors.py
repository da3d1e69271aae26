"""The zoo's detectors (run by tests/zoo/build.py in `.venv-zoo`): TF Model Garden RetinaNet in
four exports, keras-hub's RetinaNet (its raw head, which the gateway refuses, and an export
with its decoding and NMS) and a YOLOv8-layout head; their detections, in pixels of the image
as a viewer shows it.

A model that takes pixels gets the shown image (as the gateway sends it); a model that takes
the encoded file decodes the stored pixels itself (TensorFlow ignores EXIF), so its boxes are
mapped through the orientation, as the gateway maps them (_oriented). The YOLO head takes
320x320: a photo is resized by tf.image.resize (bilinear; resize_filter = "tf-bilinear") and
its boxes scaled back to the photo. Every detector sees PNGs and JPEGs of several sizes and
aspect ratios, two of them EXIF-rotated (DETECTOR_PHOTOS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from build import (
    CLASSES,
    MAX_CANDIDATES,
    MAX_DETECTIONS,
    MG_SIZE,
    MIN_SCORE,
    NMS_IOU,
    SEED,
    YOLO_SIZE,
    Photo,
    scores,
)
from classifiers import IMAGENET_MEAN, IMAGENET_STD
from ties import tie_orders

DETECTOR_PHOTOS = (
    "wide320x240",
    "tall200x300",
    "yolo320",
    "photo640x480",
    "photo1200x900",
    "exif6_600x800",
    "exif3_800x600",
)


def _oriented(boxes: np.ndarray, photo: Photo) -> np.ndarray:
    """[xmin, ymin, xmax, ymax] boxes on the stored image -> on the shown one."""
    if photo.orientation == 1:
        return boxes
    x0, y0, x1, y1 = boxes.T
    if photo.orientation == 3:  # stored upside down: (x, y) -> (W - x, H - y)
        w, h = photo.width, photo.height
        return np.stack([w - x1, h - y1, w - x0, h - y0], axis=1)
    if photo.orientation == 6:  # shown rotated 90° clockwise: (x, y) -> (H_stored - y, x)
        return np.stack([photo.width - y1, x0, photo.width - y0, x1], axis=1)
    raise ValueError(f"orientation {photo.orientation} is not used by the zoo")


def _detections(out: dict[str, Any], normalized: bool, size: tuple[int, int]) -> dict[str, Any]:
    """Model Garden outputs -> boxes [xmin, ymin, xmax, ymax] in pixels of the image given."""
    count = int(out["num_detections"][0])
    info = out["image_info"][0].numpy()
    boxes = out["detection_boxes"][0][:count].numpy().astype(np.float64)
    if normalized:
        height, width = size
        boxes = boxes * np.array([height, width, height, width])
    else:
        scale = np.array([info[2][0], info[2][1], info[2][0], info[2][1]])
        offset = np.array([info[3][0], info[3][1], info[3][0], info[3][1]])
        boxes = (boxes + offset) / scale
    found = out["detection_scores"][0][:count].numpy()
    classes = out["detection_classes"][0][:count].numpy()
    keep = found >= MIN_SCORE
    return {
        "boxes": boxes[keep][:, [1, 0, 3, 2]],
        "scores": scores(found[keep]),
        "classes": [int(c) for c in classes[keep]],
    }


def model_garden(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    from official.core import exp_factory
    from official.vision.serving import detection, export_saved_model_lib

    tf.keras.utils.set_random_seed(SEED)
    expected: dict[str, Any] = {}
    params = exp_factory.get_exp_config("retinanet_resnetfpn_coco")
    params.task.model.input_size = [MG_SIZE, MG_SIZE, 3]
    params.task.model.num_classes = CLASSES + 1  # class 0 is the background
    params.task.model.backbone.resnet.model_id = 18
    params.task.model.detection_generator.max_num_detections = 50
    exports = {
        "mg_retinanet_image_tensor": ("image_tensor", False),
        "mg_retinanet_image_bytes": ("image_bytes", False),
        "mg_retinanet_tf_example": ("tf_example", False),
        "mg_retinanet_image_tensor_normalized": ("image_tensor", True),
    }
    weights = None
    for name, (input_type, normalized) in exports.items():
        params.task.export_config.output_normalized_coordinates = normalized
        module = detection.DetectionModule(
            params=params, batch_size=1, input_image_size=[MG_SIZE, MG_SIZE],
            input_type=input_type, num_channels=3,
        )  # fmt: skip
        model = module.model
        if weights is None:
            # Random weights give scores near the head's prior (0.01), under any threshold:
            # spread the class logits (the head's `scores` conv) so that some boxes pass,
            # each with its own score.
            rng = np.random.default_rng(SEED)
            for variable in model.variables:
                if variable.name.startswith("retina_net_head/scores/"):
                    mean, std = (-3.0, 0.5) if "bias" in variable.name else (0.0, 0.8)
                    variable.assign(rng.normal(mean, std, variable.shape).astype(np.float32))
            weights = model.get_weights()
        else:
            model.set_weights(weights)
        export_saved_model_lib.export_inference_graph(
            input_type, 1, [MG_SIZE, MG_SIZE], params, None, str(models / name / "1"),
            export_module=module,
        )  # fmt: skip
        serve = detection.DetectionModule(
            params=params, batch_size=1, input_image_size=[MG_SIZE, MG_SIZE],
            input_type="image_tensor", num_channels=3, model=model,
        )  # fmt: skip
        results = {}
        for photo in (photos[p] for p in DETECTOR_PHOTOS):
            encoded = input_type != "image_tensor"
            # An encoded export decodes the file in its graph as export_base._decode_image
            # does (tf.image.decode_image, EXIF ignored); a pixel export gets the shown image.
            pixels = (
                tf.image.decode_image(photo.data, channels=3).numpy() if encoded else photo.shown()
            )
            found = _detections(
                serve.serve(tf.constant(pixels[None])), normalized, pixels.shape[:2]
            )
            if encoded:
                found["boxes"] = _oriented(found["boxes"], photo)
            found["boxes"] = found["boxes"].tolist()
            results[photo.name] = found
        expected[name] = results
    return expected


def _spread(detector: Any, head: Any, inputs: Any, output: str, spread: float, bias: float) -> None:
    """Sets the final conv of a random keras-hub head (its last kernel and bias) so that the
    detector's `output` on `inputs` spreads by `spread` around `bias`, as a trained head's
    does: Keras' initial weights give class scores all near the prior or all saturated, and
    box deltas that throw boxes far out of the image."""
    kernel, offset = head.weights[-2:]
    kernel.assign(np.random.default_rng(SEED).normal(0, 1, kernel.shape).astype(np.float32))
    offset.assign(np.zeros(offset.shape, np.float32))
    # Each channel of the conv (anchor x class, or anchor x box coordinate) centred on
    # `bias` (random kernels otherwise favour one class everywhere), spread by `spread`:
    # with a zero bias the outputs scale with the kernel.
    channels = np.asarray(detector(inputs)[output]).reshape(-1, offset.shape[0])
    means = channels.mean(axis=0)
    factor = spread / float((channels - means).std())
    kernel.assign((kernel.numpy() * factor).astype(np.float32))
    offset.assign((bias - means * factor).astype(np.float32))


def keras_hub_detector(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    """keras-hub's RetinaNet: `Model.export()` gives the raw head (anchor deltas and class
    logits), which the gateway refuses; exported with the detector's own decoding
    (`decode_predictions`: anchors, box deltas, its NonMaxSuppression layer) as the serving
    function (keras.export.ExportArchive), the gateway serves it. keras-hub's
    NonMaxSuppression needs a static batch (a `None` batch fails tracing with "Expected
    int32, but got None"): that export takes one MG_SIZE x MG_SIZE image. Preprocessing: a
    RetinaNetImageConverter stretching to MG_SIZE (tf.image.resize, bilinear) with the
    ImageNet mean/std; boxes in pixels of its input, scaled back to the photo. Its traced NMS
    drops boxes by rank (tests/zoo/ties.py): `alternatives` are its answers for the other
    orders of scores tied within float32 rounding."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(SEED)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
        stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(None, None, 3),
    )  # fmt: skip
    detector = keras_hub.models.RetinaNetObjectDetector(
        backbone=keras_hub.models.RetinaNetBackbone(
            image_encoder=backbone, min_level=3, max_level=7, use_p5=False
        ),
        anchor_generator=keras_hub.layers.AnchorGenerator(
            bounding_box_format="yxyx", min_level=3, max_level=7, num_scales=3,
            aspect_ratios=[0.5, 1.0, 2.0], anchor_size=4,
        ),
        num_classes=CLASSES,
        bounding_box_format="yxyx",
    )  # fmt: skip
    detector.export(str(models / "keras_hub_retinanet" / "1"))
    converter = keras_hub.layers.RetinaNetImageConverter(
        image_size=(MG_SIZE, MG_SIZE), scale=list(1 / (255 * IMAGENET_STD)),
        offset=list(-IMAGENET_MEAN / IMAGENET_STD), crop_to_aspect_ratio=False,
    )  # fmt: skip

    def prepared(photo: Photo) -> Any:
        return converter(photo.shown().astype(np.float32)[None])

    first = prepared(photos[DETECTOR_PHOTOS[0]])
    _spread(detector, detector.classification_head, first, "cls_logits", 1.0, -3.0)
    _spread(detector, detector.box_head, first, "bbox_regression", 0.3, 0.0)

    def serve(images: Any) -> Any:
        return detector.decode_predictions(detector(images, training=False), images)

    archive = keras.export.ExportArchive()
    archive.track(detector)
    spec = keras.InputSpec(shape=(1, MG_SIZE, MG_SIZE, 3), dtype="float32")
    endpoint = archive.add_endpoint("serve", serve, input_signature=[spec])
    archive.write_out(str(models / "keras_hub_retinanet_decoded" / "1"))
    results = {}
    for photo in (photos[p] for p in DETECTOR_PHOTOS):
        images = prepared(photo)
        found = endpoint(images)  # the exported function, traced as TF Serving runs it
        count = int(found["num_detections"][0])
        own = [np.asarray(found[k][0][:count]) for k in ("boxes", "confidence", "labels")]
        answers = tie_orders(detector, images)
        # keras-hub's NMS traced on its candidates gives what the export gives.
        boxes, confidence, labels = answers[0]
        assert np.array_equal(labels, own[2]) and np.allclose(boxes, own[0], atol=1e-4)
        assert np.allclose(confidence, own[1], rtol=0, atol=1e-6), photo.name
        results[photo.name] = {
            **_pixels(own, photo),
            "alternatives": [_pixels(a, photo) for a in answers[1:]],
        }
    return {"keras_hub_retinanet_decoded": results}


def _pixels(answer: list[np.ndarray], photo: Photo) -> dict[str, Any]:
    """keras-hub's yxyx boxes in pixels of its MG_SIZE input, confidence and labels -> the
    detections over MIN_SCORE, boxes [xmin, ymin, xmax, ymax] in pixels of the photo."""
    yxyx, confidence, labels = answer
    keep = confidence >= MIN_SCORE
    scale = np.array([photo.width, photo.height] * 2) / MG_SIZE
    return {
        "boxes": (yxyx.astype(np.float64)[keep][:, [1, 0, 3, 2]] * scale).tolist(),
        "scores": scores(confidence[keep]),
        "classes": [int(c) for c in labels[keep]],
    }


# ---- A YOLOv8-layout head -------------------------------------------------------------------


def yolo_model(classes: int, size: int) -> Any:
    """A small CSP-free backbone with YOLOv8's anchor-free, decoupled head and DFL decoding:
    output [batch, 4 + classes, candidates], boxes as cx, cy, w, h in input pixels, class
    scores through a sigmoid; candidates are the cells of strides 8, 16 and 32."""
    import keras
    from keras import layers, ops

    reg_max = 16
    inputs = keras.Input((size, size, 3))
    x = inputs
    features = []
    for i, filters in enumerate([16, 32, 64, 96, 128]):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("silu")(x)
        if i >= 2:
            features.append(x)
    boxes, found = [], []
    for feature, stride in zip(features, (8, 16, 32), strict=True):
        cells = size // stride
        b = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        # Wider initial weights than Keras' defaults, so that random boxes and scores vary
        # from cell to cell as a trained model's do.
        spread = keras.initializers.RandomNormal(stddev=12.0, seed=stride)
        b = layers.Conv2D(4 * reg_max, 1, kernel_initializer=spread)(b)
        c = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        c = layers.Conv2D(
            classes, 1, kernel_initializer=spread,
            bias_initializer=keras.initializers.Constant(-3.0),
        )(c)  # fmt: skip
        b = ops.reshape(b, (-1, cells * cells, 4, reg_max))
        distance = ops.sum(ops.softmax(b, axis=-1) * ops.arange(reg_max, dtype="float32"), -1)
        grid_y, grid_x = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
        anchors = ops.convert_to_tensor(
            np.stack([grid_x, grid_y], -1).reshape(1, -1, 2).astype(np.float32) + 0.5
        )
        top_left = ops.subtract(anchors, distance[..., :2])
        bottom_right = ops.add(anchors, distance[..., 2:])
        centre = (top_left + bottom_right) / 2 * stride
        extent = (bottom_right - top_left) * stride
        boxes.append(ops.concatenate([centre, extent], axis=-1))
        found.append(ops.sigmoid(ops.reshape(c, (-1, cells * cells, classes))))
    head = ops.concatenate([ops.concatenate(boxes, 1), ops.concatenate(found, 1)], axis=-1)
    return keras.Model(inputs, ops.transpose(head, (0, 2, 1)), name="yolo")


def yolo_reference(head: np.ndarray, scale: tuple[float, float]) -> dict[str, Any]:
    """The YOLO head decoded with TensorFlow: best class per candidate, scores >= MIN_SCORE,
    the best MAX_CANDIDATES, tf.image.non_max_suppression per class (in the model's input
    pixels); boxes then scaled by (x, y) `scale` to the photo."""
    class_scores = head[4:]
    best = class_scores.argmax(axis=0)
    score = class_scores.max(axis=0).astype(np.float64)
    passing = np.flatnonzero(score >= MIN_SCORE)
    passing = passing[np.argsort(-score[passing], kind="stable")[:MAX_CANDIDATES]]
    cx, cy, w, h = (head[i, passing].astype(np.float64) for i in range(4))
    yxyx = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
    kept: list[int] = []
    for c in np.unique(best[passing]):
        members = np.flatnonzero(best[passing] == c)
        chosen = tf.image.non_max_suppression(
            yxyx[members].astype(np.float32), score[passing][members].astype(np.float32),
            len(members), iou_threshold=NMS_IOU,
        ).numpy()  # fmt: skip
        kept.extend(members[chosen].tolist())
    kept.sort(key=lambda i: -score[passing][i])
    kept = kept[:MAX_DETECTIONS]
    xyxy = yxyx[kept][:, [1, 0, 3, 2]] * np.array([scale[0], scale[1], scale[0], scale[1]])
    return {
        "boxes": xyxy.tolist(),
        "scores": scores(score[passing][kept]),
        "classes": [int(c) for c in best[passing][kept]],
    }


def yolo(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    import keras

    keras.utils.set_random_seed(SEED)
    model = yolo_model(CLASSES, YOLO_SIZE)
    model.export(str(models / "yolo_v8_layout" / "1"))
    results = {}
    for photo in (photos[p] for p in DETECTOR_PHOTOS):
        # RGB scaled to [0, 1], as Ultralytics feeds it; stretched to the input size.
        pixels = tf.image.resize(photo.shown(), (YOLO_SIZE, YOLO_SIZE), method="bilinear")
        head = np.asarray(model(pixels.numpy()[None] / 255.0))[0]
        scale = (photo.width / YOLO_SIZE, photo.height / YOLO_SIZE)
        results[photo.name] = yolo_reference(head, scale)
    return {"yolo_v8_layout": results}


BUILDERS = {
    "model_garden_detectors": model_garden,
    "keras_hub_detector": keras_hub_detector,
    "yolo": yolo,
}
