"""The zoo's embedders (run by tests/zoo/build.py in `.venv-zoo`): image models exported with
random weights without their classification head, as people export them for similarity
search, and each photo's feature vector (raw, not normalised) computed by the library with
the preprocessing it documents, on the image as a viewer shows it (EXIF applied).

- Keras 3 MobileNetV3Small, include_top=False, pooling="avg", exported by model.export():
  one output, `output_0` [b, 576]; images loaded by keras.utils.load_img(interpolation=
  "bilinear") (resize_filter = "pillow-bilinear"), rescaled in the graph.
- Hugging Face TFViTModel, save_pretrained(saved_model=True): `pooler_output` [b, 96] beside
  `last_hidden_state` [b, 197, 96]; ViTImageProcessor: 224x224 Pillow BILINEAR
  ("pillow-bilinear"), 1/255, mean = std = 0.5, NCHW.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from build import SEED, Photo, calibrate
from classifiers import SIZE, _batch, _each, _saved_pretrained


def keras_embedder(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    """MobileNetV3Small without its top, average-pooled: the 576 features before the
    classifier. Its BatchNormalization statistics are those of four photos (build.calibrate),
    so the features move with the image as a trained model's do."""
    import keras

    keras.utils.set_random_seed(SEED)
    model = keras.applications.MobileNetV3Small(
        weights=None, include_top=False, pooling="avg", input_shape=(*SIZE, 3)
    )
    calibrate(model, _batch(photos))
    model.export(str(models / "keras_mobilenetv3small_embedder" / "1"))

    def embed(photo: Photo) -> Any:
        image = keras.utils.load_img(photo.shown_png(), target_size=SIZE, interpolation="bilinear")
        return model(np.asarray(keras.utils.img_to_array(image), dtype=np.float32)[None])

    return {"keras_mobilenetv3small_embedder": _each(photos, embed)}


def hugging_face_embedder(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    """A ViT vision tower (TFViTModel, no head): `pooler_output` is the [CLS] token through
    the pooler (dense + tanh), the image embedding its users take. Initialised wider than
    the default (initializer_range 0.02) so the random tower's [CLS] output depends on the
    patches more than on its own parameters."""
    import tensorflow as tf
    from PIL import Image
    from transformers import TFViTModel, ViTConfig, ViTImageProcessor

    tf.keras.utils.set_random_seed(SEED)
    config = ViTConfig(
        image_size=224, patch_size=16, hidden_size=96, num_hidden_layers=3,
        num_attention_heads=3, intermediate_size=192, initializer_range=0.2,
    )  # fmt: skip
    model = TFViTModel(config)
    model(model.dummy_inputs)
    processor = ViTImageProcessor()  # 224x224, Pillow BILINEAR, 1/255, mean = std = 0.5

    def embed(photo: Photo) -> Any:
        image = Image.fromarray(photo.shown())
        pixel_values = processor(image, return_tensors="tf")["pixel_values"]
        return model(pixel_values=pixel_values).pooler_output

    _saved_pretrained(model, models, "hf_vit_embedder")
    return {"hf_vit_embedder": _each(photos, embed)}


BUILDERS = {
    "keras_embedder": keras_embedder,
    "hf_embedder": hugging_face_embedder,
}
