"""The zoo's classifiers (run by tests/zoo/build.py in `.venv-zoo`): each exported by its
library with random weights, its final layer rescaled so that the classes separate
(build.sharpen), and its scores on every classifier photo computed with the preprocessing its
library documents: the library's own loader, resizing and normalisation, on the image as a
viewer shows it (EXIF applied).

| model | resizing (the gateway's resize_filter) | normalisation |
|---|---|---|
| Keras 3 MobileNetV3Small | load_img(interpolation="bilinear"): pillow-bilinear | in the graph |
| Keras 3 EfficientNetB0 | keras.layers.Resizing: tf-bilinear | in the graph |
| tf_keras ResNet50 | keras.utils.load_img's default: nearest | caffe: BGR, means |
| Hugging Face ViT | ViTImageProcessor: pillow-bilinear | 1/255, mean = std = 0.5 |
| Hugging Face ConvNeXt | ConvNextImageProcessor, 384 (no crop): pillow-bicubic | 1/255, ImageNet |
| Model Garden ResNet | in the graph (the gateway sends the full image) | in the graph |
| keras-hub ResNet | ResNetImageConverter(antialias=True): tf-bilinear-antialias | 1/255, ImageNet |
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from build import CLASSIFIER_PHOTOS, SEED, Photo, calibrate, scores, sharpen, softmax

SIZE = (224, 224)
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def _batch(photos: dict[str, Photo]) -> np.ndarray:
    """Four photos at 224x224, float32 0..255 RGB: what calibrate() runs the models on."""
    return np.stack(
        [tf.image.resize(photos[n].shown(), SIZE).numpy() for n in CLASSIFIER_PHOTOS[:4]]
    )


def _each(photos: dict[str, Photo], score: Any) -> dict[str, list[float]]:
    return {name: scores(score(photos[name])) for name in CLASSIFIER_PHOTOS}


def keras_applications(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    import keras
    import tf_keras

    keras.utils.set_random_seed(SEED)
    batch = _batch(photos)
    first = batch[:1]
    expected = {}

    def load(photo: Photo, interpolation: str, utils: Any = keras.utils) -> np.ndarray:
        image = utils.load_img(photo.shown_png(), target_size=SIZE, interpolation=interpolation)
        return np.asarray(utils.img_to_array(image), dtype=np.float32)[None]

    # Keras 3's model.export(): MobileNetV3 and EfficientNet rescale in the graph
    # (include_preprocessing), so 0..255 RGB floats go in; one output, `output_0`.
    mnv3 = keras.applications.MobileNetV3Small(weights=None, input_shape=(*SIZE, 3))
    calibrate(mnv3, batch)
    sharpen(mnv3.variables, 1000, np.log(np.asarray(mnv3(first))))
    mnv3.export(str(models / "keras_mobilenetv3small_export" / "1"))
    expected["keras_mobilenetv3small_export"] = _each(photos, lambda p: mnv3(load(p, "bilinear")))
    effnet = keras.applications.EfficientNetB0(weights=None)
    calibrate(effnet, batch)
    sharpen(effnet.variables, 1000, np.log(np.asarray(effnet(first))))
    effnet.export(str(models / "keras_efficientnetb0_export" / "1"))
    resizing = keras.layers.Resizing(*SIZE)  # bilinear, no antialias: tf.image.resize
    expected["keras_efficientnetb0_export"] = _each(
        photos, lambda p: effnet(resizing(p.shown().astype(np.float32)[None]))
    )
    # tf.saved_model.save of a tf.keras (Keras 2, `tf_keras`) model: the output is named after
    # its layer, `predictions`. ResNet50 takes "caffe" input: BGR, ImageNet means subtracted,
    # no scaling. (Keras 3 models saved this way do not run in TF Serving's loader, which
    # finds their variables uninitialized: keras-team/keras#19274; Keras 3 has export().)
    # Images loaded as the Keras docs show: load_img(path, target_size=(224, 224)), nearest.
    tf_keras.utils.set_random_seed(SEED)
    resnet = tf_keras.applications.ResNet50(weights=None)
    caffe = tf_keras.applications.resnet50.preprocess_input
    calibrate(resnet, caffe(batch.copy()))
    sharpen(resnet.variables, 1000, np.log(np.asarray(resnet(caffe(first.copy())))))
    tf.saved_model.save(resnet, str(models / "tf_keras_resnet50_saved_model" / "1"))
    expected["tf_keras_resnet50_saved_model"] = _each(
        photos, lambda p: resnet(caffe(load(p, "nearest", tf_keras.utils)))
    )
    return expected


def _saved_pretrained(model: Any, models: Path, name: str) -> None:
    """`save_pretrained(saved_model=True)` writes DIR/saved_model/1 beside the weights; the
    zoo serves MODELS/name/1."""
    staging = models / f"{name}_pretrained"
    model.save_pretrained(str(staging), saved_model=True)
    (models / name).mkdir()
    os.replace(staging / "saved_model" / "1", models / name / "1")
    for leftover in sorted(staging.rglob("*"), reverse=True):
        leftover.unlink() if leftover.is_file() else leftover.rmdir()
    staging.rmdir()


def hugging_face(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    from PIL import Image
    from transformers import TFViTForImageClassification, ViTConfig, ViTImageProcessor

    tf.keras.utils.set_random_seed(SEED)
    config = ViTConfig(
        image_size=224, patch_size=16, hidden_size=96, num_hidden_layers=3,
        num_attention_heads=3, intermediate_size=192, num_labels=10,
    )  # fmt: skip
    model = TFViTForImageClassification(config)
    model(model.dummy_inputs)
    # resize to 224x224 with Pillow's BILINEAR, rescale 1/255, mean = std = 0.5, NCHW
    processor = ViTImageProcessor()

    def logits(photo: Photo) -> Any:
        image = Image.fromarray(photo.shown())
        pixel_values = processor(image, return_tensors="tf")["pixel_values"]
        return model(pixel_values=pixel_values).logits

    sharpen(model.classifier.variables, 10, logits(photos[CLASSIFIER_PHOTOS[0]]))
    _saved_pretrained(model, models, "hf_vit")
    return {"hf_vit": _each(photos, lambda p: softmax(logits(p)))}


def hugging_face_convnext(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    """ConvNeXt with the processor its 384 px checkpoints ship (facebook/convnext-*-384):
    ConvNextImageProcessor, shortest_edge 384, which resizes to 384x384 without cropping
    (below 384 it crops, which the gateway does not), Pillow's BICUBIC, 1/255, ImageNet
    mean/std, NCHW."""
    from PIL import Image
    from transformers import (
        ConvNextConfig,
        ConvNextImageProcessor,
        TFConvNextForImageClassification,
    )

    tf.keras.utils.set_random_seed(SEED)
    config = ConvNextConfig(
        image_size=384, hidden_sizes=[24, 48, 96, 192], depths=[1, 1, 2, 1],
        layer_scale_init_value=0.5, num_labels=10,
    )  # fmt: skip
    model = TFConvNextForImageClassification(config)
    model(model.dummy_inputs)
    processor = ConvNextImageProcessor(
        size={"shortest_edge": 384}, resample=Image.Resampling.BICUBIC,
        image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD),
    )  # fmt: skip

    def logits(photo: Photo) -> Any:
        image = Image.fromarray(photo.shown())
        pixel_values = processor(image, return_tensors="tf")["pixel_values"]
        return model(pixel_values=pixel_values).logits

    sharpen(model.classifier.variables, 10, logits(photos[CLASSIFIER_PHOTOS[0]]))
    _saved_pretrained(model, models, "hf_convnext")
    return {"hf_convnext": _each(photos, lambda p: softmax(logits(p)))}


def model_garden(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    from official.core import exp_factory
    from official.vision.serving import export_saved_model_lib, image_classification

    tf.keras.utils.set_random_seed(SEED)
    classifier = exp_factory.get_exp_config("resnet_imagenet")
    classifier.task.model.num_classes = 10
    classifier.task.model.input_size = [*SIZE, 3]
    classifier.task.model.backbone.resnet.model_id = 18
    module = image_classification.ClassificationModule(
        params=classifier, batch_size=1, input_image_size=list(SIZE),
        input_type="image_tensor", num_channels=3,
    )  # fmt: skip

    def serve(photo: Photo) -> dict[str, Any]:
        # The graph crops and resizes: it gets the whole image, as the gateway sends it.
        return module.serve(tf.constant(photo.shown()[None]))

    first = serve(photos[CLASSIFIER_PHOTOS[0]])
    sharpen(module.model.variables, 10, first["logits"])
    export_saved_model_lib.export_inference_graph(
        "image_tensor", 1, list(SIZE), classifier, None,
        str(models / "mg_classifier" / "1"), export_module=module,
    )  # fmt: skip
    return {"mg_classifier": _each(photos, lambda p: serve(p)["probs"])}


def keras_hub_classifier(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    import keras
    import keras_hub

    keras.utils.set_random_seed(SEED)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[2, 2, 2, 2],
        stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(*SIZE, 3),
    )  # fmt: skip
    classifier = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=10)
    # The ImageNet preprocessing of keras-hub's ResNet presets (x / 255, mean/std per
    # channel), resizing with antialias and without cropping to the aspect ratio.
    converter = keras_hub.layers.ResNetImageConverter(
        image_size=SIZE, scale=list(1 / (255 * IMAGENET_STD)),
        offset=list(-IMAGENET_MEAN / IMAGENET_STD), crop_to_aspect_ratio=False, antialias=True,
    )  # fmt: skip

    def logits(photo: Photo) -> Any:
        return classifier(converter(photo.shown().astype(np.float32)[None]))

    calibrate(classifier, converter(_batch(photos)))
    sharpen(classifier.variables, 10, logits(photos[CLASSIFIER_PHOTOS[0]]))
    classifier.export(str(models / "keras_hub_resnet_classifier" / "1"))
    return {"keras_hub_resnet_classifier": _each(photos, lambda p: softmax(logits(p)))}


BUILDERS = {
    "keras": keras_applications,
    "hf": hugging_face,
    "hf_convnext": hugging_face_convnext,
    "model_garden_classifier": model_garden,
    "keras_hub_classifier": keras_hub_classifier,
}
