"""Builds the model zoo: real exporters' SavedModels with random weights, and what each model
gives when run directly in TensorFlow by the library that made it.

Runs in the exporters' own venv (`.venv-zoo`, `make zoo-venv`), not the project's: it imports
TensorFlow Model Garden, keras-hub, Keras 3 and Hugging Face transformers, and nothing of the
gateway. `tests/zoo/conftest.py` runs it and caches the result.

    .venv-zoo/bin/python tests/zoo/build.py OUT_DIR

Writes OUT_DIR/models/<name>/1/ (one SavedModel per export), OUT_DIR/images/*.png (the test
images) and OUT_DIR/expected.json: per model and image, the library's result (classification:
every class's score; detection: boxes in pixels of the original image, scores and classes,
after NMS), computed with the preprocessing the library documents for that model.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # the kernels serving.local runs
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")

import numpy as np
import tensorflow as tf
from PIL import Image

SEED = 26
CLASSES = 6  # detection classes of the small detectors
YOLO_SIZE = 320
MG_SIZE = 256
MIN_SCORE = 0.25  # the detection threshold the tests ask the gateway for
NMS_IOU = 0.45  # the YOLO decoder's default
MAX_CANDIDATES = 1000
MAX_DETECTIONS = 100


def images(out: Path) -> dict[str, np.ndarray]:
    """Synthetic photos: soft gradients with noise and a few solid shapes (no two alike)."""
    rng = np.random.default_rng(SEED)
    sizes = {"square224": (224, 224), "wide320x240": (240, 320), "tall200x300": (300, 200)}
    sizes["yolo320"] = (YOLO_SIZE, YOLO_SIZE)
    result = {}
    (out / "images").mkdir(parents=True, exist_ok=True)
    for name, (h, w) in sizes.items():
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x / w, y / h, 1 - x / w], axis=-1) * 160 + 40
        pixels = base + rng.normal(0, 12, (h, w, 3))
        for _ in range(5):
            y0, x0 = rng.integers(0, h - 20), rng.integers(0, w - 20)
            y1, x1 = y0 + rng.integers(15, h // 2), x0 + rng.integers(15, w // 2)
            pixels[y0:y1, x0:x1] = rng.integers(0, 255, 3)
        array = np.clip(pixels, 0, 255).astype(np.uint8)
        Image.fromarray(array).save(out / "images" / f"{name}.png")
        result[name] = array
    return result


def _scores(vector: Any) -> list[float]:
    return [float(v) for v in np.asarray(vector, dtype=np.float64).reshape(-1)]


# ---- Keras 3 applications -------------------------------------------------------------------


def keras_applications(models: Path, photos: dict[str, np.ndarray]) -> dict[str, Any]:
    import keras
    import tf_keras

    keras.utils.set_random_seed(SEED)
    x = photos["square224"].astype(np.float32)[None]
    expected = {}
    # Keras 3's model.export(): MobileNetV3 and EfficientNet rescale in the graph
    # (include_preprocessing), so 0..255 RGB floats go in; one output, `output_0`.
    mnv3 = keras.applications.MobileNetV3Small(weights=None, input_shape=(224, 224, 3))
    mnv3.export(str(models / "keras_mobilenetv3small_export" / "1"))
    expected["keras_mobilenetv3small_export"] = {"square224": _scores(mnv3(x))}
    effnet = keras.applications.EfficientNetB0(weights=None)
    effnet.export(str(models / "keras_efficientnetb0_export" / "1"))
    expected["keras_efficientnetb0_export"] = {"square224": _scores(effnet(x))}
    # tf.saved_model.save of a tf.keras (Keras 2, `tf_keras`) model: the output is named after
    # its layer, `predictions`. ResNet50 takes "caffe" input: BGR, ImageNet means subtracted,
    # no scaling. (Keras 3 models saved this way do not run in TF Serving's loader, which
    # finds their variables uninitialized: keras-team/keras#19274; Keras 3 has export().)
    tf_keras.utils.set_random_seed(SEED)
    resnet = tf_keras.applications.ResNet50(weights=None)
    tf.saved_model.save(resnet, str(models / "tf_keras_resnet50_saved_model" / "1"))
    prepared = tf_keras.applications.resnet50.preprocess_input(x.copy())
    expected["tf_keras_resnet50_saved_model"] = {"square224": _scores(resnet(prepared))}
    return expected


# ---- Hugging Face transformers (TensorFlow ViT) ---------------------------------------------


def hugging_face(models: Path, photos: dict[str, np.ndarray]) -> dict[str, Any]:
    from transformers import TFViTForImageClassification, ViTConfig, ViTImageProcessor

    tf.keras.utils.set_random_seed(SEED)
    config = ViTConfig(
        image_size=224, patch_size=16, hidden_size=96, num_hidden_layers=3,
        num_attention_heads=3, intermediate_size=192, num_labels=10,
    )  # fmt: skip
    model = TFViTForImageClassification(config)
    model(model.dummy_inputs)
    target = models / "hf_vit"
    model.save_pretrained(str(target), saved_model=True)
    os.replace(target / "saved_model" / "1", models / "hf_vit_1")
    for leftover in sorted(target.rglob("*"), reverse=True):
        leftover.unlink() if leftover.is_file() else leftover.rmdir()
    target.rmdir()
    (models / "hf_vit").mkdir()
    os.replace(models / "hf_vit_1", models / "hf_vit" / "1")
    processor = ViTImageProcessor(do_resize=False)  # rescale 1/255, mean = std = 0.5, NCHW
    pixel_values = processor(photos["square224"], return_tensors="tf")["pixel_values"]
    logits = model(pixel_values=pixel_values).logits
    return {"hf_vit": {"square224": _scores(tf.nn.softmax(logits))}}


# ---- TensorFlow Model Garden ----------------------------------------------------------------


def _detections(out: dict[str, Any], normalized: bool, size: tuple[int, int]) -> dict[str, Any]:
    """Model Garden outputs -> boxes [xmin, ymin, xmax, ymax] in pixels of the original."""
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
    scores = out["detection_scores"][0][:count].numpy()
    classes = out["detection_classes"][0][:count].numpy()
    keep = scores >= MIN_SCORE
    return {
        "boxes": boxes[keep][:, [1, 0, 3, 2]].tolist(),
        "scores": _scores(scores[keep]),
        "classes": [int(c) for c in classes[keep]],
    }


def model_garden(models: Path, photos: dict[str, np.ndarray]) -> dict[str, Any]:
    from official.core import exp_factory
    from official.vision.serving import detection, export_saved_model_lib, image_classification

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
        results = {}
        for photo in ("wide320x240", "tall200x300"):
            pixels = photos[photo]
            serve = detection.DetectionModule(
                params=params, batch_size=1, input_image_size=[MG_SIZE, MG_SIZE],
                input_type="image_tensor", num_channels=3, model=model,
            )  # fmt: skip
            out = serve.serve(tf.constant(pixels[None]))
            results[photo] = _detections(out, normalized, pixels.shape[:2])
        expected[name] = results

    classifier = exp_factory.get_exp_config("resnet_imagenet")
    classifier.task.model.num_classes = 10
    classifier.task.model.input_size = [224, 224, 3]
    classifier.task.model.backbone.resnet.model_id = 18
    module = image_classification.ClassificationModule(
        params=classifier, batch_size=1, input_image_size=[224, 224],
        input_type="image_tensor", num_channels=3,
    )  # fmt: skip
    export_saved_model_lib.export_inference_graph(
        "image_tensor", 1, [224, 224], classifier, None,
        str(models / "mg_classifier" / "1"), export_module=module,
    )  # fmt: skip
    out = module.serve(tf.constant(photos["square224"][None]))
    expected["mg_classifier"] = {"square224": _scores(out["probs"])}
    return expected


# ---- keras-hub ------------------------------------------------------------------------------


def keras_hub_models(models: Path, photos: dict[str, np.ndarray]) -> dict[str, Any]:
    import keras
    import keras_hub

    keras.utils.set_random_seed(SEED)

    def backbone(shape: tuple[Any, ...]) -> Any:
        return keras_hub.models.ResNetBackbone(
            input_conv_filters=[64], input_conv_kernel_sizes=[7],
            stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
            stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
            use_pre_activation=False, image_shape=shape,
        )  # fmt: skip

    classifier = keras_hub.models.ResNetImageClassifier(
        backbone=backbone((224, 224, 3)), num_classes=10
    )
    classifier.export(str(models / "keras_hub_resnet_classifier" / "1"))
    # The ImageNet preprocessing of keras-hub's ResNet presets: x / 255, mean/std per channel.
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    converter = keras_hub.layers.ResNetImageConverter(
        image_size=(224, 224), scale=list(1 / (255 * std)), offset=list(-mean / std)
    )
    prepared = converter(photos["square224"].astype(np.float32)[None])
    logits = classifier(prepared)
    expected = {"keras_hub_resnet_classifier": {"square224": _scores(tf.nn.softmax(logits))}}

    detector = keras_hub.models.RetinaNetObjectDetector(
        backbone=keras_hub.models.RetinaNetBackbone(
            image_encoder=backbone((None, None, 3)), min_level=3, max_level=7, use_p5=False
        ),
        anchor_generator=keras_hub.layers.AnchorGenerator(
            bounding_box_format="yxyx", min_level=3, max_level=7, num_scales=3,
            aspect_ratios=[0.5, 1.0, 2.0], anchor_size=4,
        ),
        num_classes=CLASSES,
        bounding_box_format="yxyx",
    )  # fmt: skip
    detector.export(str(models / "keras_hub_retinanet" / "1"))
    return expected


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
    boxes, scores = [], []
    for feature, stride in zip(features, (8, 16, 32), strict=True):
        cells = size // stride
        b = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        # Wider initial weights than Keras' defaults, so that random boxes and scores vary
        # from cell to cell as a trained model's do.
        spread = keras.initializers.RandomNormal(stddev=12.0, seed=stride)
        b = layers.Conv2D(4 * reg_max, 1, kernel_initializer=spread)(b)
        c = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        c = layers.Conv2D(
            classes,
            1,
            kernel_initializer=spread,
            bias_initializer=keras.initializers.Constant(-3.0),
        )(c)
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
        scores.append(ops.sigmoid(ops.reshape(c, (-1, cells * cells, classes))))
    head = ops.concatenate([ops.concatenate(boxes, 1), ops.concatenate(scores, 1)], axis=-1)
    return keras.Model(inputs, ops.transpose(head, (0, 2, 1)), name="yolo")


def yolo_reference(head: np.ndarray) -> dict[str, Any]:
    """The YOLO head decoded with TensorFlow: best class per candidate, scores >= MIN_SCORE,
    the best MAX_CANDIDATES, tf.image.non_max_suppression per class."""
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
    return {
        "boxes": yxyx[kept][:, [1, 0, 3, 2]].tolist(),
        "scores": _scores(score[passing][kept]),
        "classes": [int(c) for c in best[passing][kept]],
    }


def yolo(models: Path, photos: dict[str, np.ndarray]) -> dict[str, Any]:
    import keras

    keras.utils.set_random_seed(SEED)
    model = yolo_model(CLASSES, YOLO_SIZE)
    model.export(str(models / "yolo_v8_layout" / "1"))
    # Ultralytics feeds RGB scaled to [0, 1].
    head = np.asarray(model(photos["yolo320"].astype(np.float32)[None] / 255.0))[0]
    return {"yolo_v8_layout": {"yolo320": yolo_reference(head)}}


BUILDERS = {
    "keras": keras_applications,
    "hf": hugging_face,
    "model_garden": model_garden,
    "keras_hub": keras_hub_models,
    "yolo": yolo,
}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    chosen = argv[1:] or list(BUILDERS)
    models = out / "models"
    models.mkdir(parents=True, exist_ok=True)
    photos = images(out)
    expected: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name in chosen:
        started = time.monotonic()
        expected.update(BUILDERS[name](models, photos))
        timings[name] = round(time.monotonic() - started, 1)
        print(f"zoo: built {name} in {timings[name]} s", flush=True)
    settings = {
        "min_score": MIN_SCORE,
        "nms_iou": NMS_IOU,
        "max_candidates": MAX_CANDIDATES,
        "max_detections": MAX_DETECTIONS,
    }
    document = {"settings": settings, "timings": timings, "expected": expected}
    (out / "expected.json").write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
