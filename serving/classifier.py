"""A deterministic reference image classifier built from TensorFlow ops, in three ViT forms.

Each pixel belongs to the palette colour nearest to it (Euclidean RGB; the palette is the
eight corners of the RGB cube, serving.reference.CLASSIFIER_PALETTE, in labels.txt order),
and the probability of a class is the share of the image's pixels that belong to it: an
image that is 70 % blue scores blue 0.70. No weights to download, and exact answers a test
can compute in numpy.

The same function is exported in the three forms a Hugging Face ViT takes in TF Serving:
- `EncodedImageClassifier` (model `classifier`): preprocessing in the graph, like the HF
  "TF Serving with preprocessing" export: `string_input` string [-1] of base64url images
  (tf.io.decode_base64: web-safe alphabet, padding optional), decoded (JPEG/PNG/GIF/BMP,
  3 channels, first frame), resized to 224x224 (bilinear, antialiased), rescaled to [0, 1];
  outputs `label` string [-1] (top-1 class name) and `confidence` float [-1] (its share).
- `ScoresClassifier` (model `classifier_scores`): `input_tensor` float32 [-1,224,224,3] in
  [0, 1], output `probabilities` float32 [-1,8].
- `LogitsClassifier` (model `classifier_logits`): the raw ViT signature, `pixel_values`
  float32 [-1,3,224,224] (NCHW) normalised as (x/255 - 0.5)/0.5, output `logits` float32
  [-1,8] = log(max(share, 1e-9)), so softmax(logits) gives the shares back within 1e-6.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from serving.reference import CLASSIFIER_PALETTE, LABELS_PATH, read_labels
from serving.shapes import checked_input

IMAGE_SIZE = 224
NUM_CLASSES = len(CLASSIFIER_PALETTE)
# log(0) is -inf; the floor keeps logits finite and moves softmax by at most 8e-9.
LOGIT_FLOOR = 1e-9
# ViT's image processor: (x/255 - mean)/std per channel.
NORMALISE_MEAN = 0.5
NORMALISE_STD = 0.5

# The palette in [0, 1], the scale every form is brought to before classifying.
PALETTE_01 = [[channel / 255.0 for channel in rgb] for rgb in CLASSIFIER_PALETTE.values()]


def colour_shares(images: tf.Tensor, palette: tf.Tensor) -> tf.Tensor:
    """Shares [B, K] of pixels nearest to each palette colour, for float32 [B, H, W, 3] images
    and palette [K, 3] on the same scale.

    Counting is exact (float32 sums of 0/1 up to 2**24); ties go to the lower class id.
    """
    pixels = tf.reshape(images, [tf.shape(images)[0], -1, 1, 3])
    dist2 = tf.reduce_sum(tf.square(pixels - palette), axis=-1)  # [B, N, K]
    nearest = tf.argmin(dist2, axis=-1, output_type=tf.int32)
    counts = tf.reduce_sum(tf.one_hot(nearest, NUM_CLASSES, dtype=tf.float32), axis=1)
    total = tf.cast(tf.shape(pixels)[1], tf.float32)
    return counts / total


def preprocess(encoded_base64: tf.Tensor) -> tf.Tensor:
    """One base64url image -> float32 [224, 224, 3] in [0, 1] (the HF export's preprocessing)."""
    encoded = tf.io.decode_base64(encoded_base64)
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False, dtype=tf.uint8)
    image.set_shape([None, None, 3])
    resized = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], method="bilinear", antialias=True)
    return resized / 255.0


class _Classifier(tf.Module):
    """The classifier's "weights": its palette and labels, plus the version it was exported as.

    Reading a variable makes the serving function stateful, so its outputs are named
    StatefulPartitionedCall:<k> like those of a real exported ViT.
    """

    def __init__(self, version: int, name: str) -> None:
        super().__init__(name=name)
        self.palette = tf.Variable(PALETTE_01, dtype=tf.float32, trainable=False, name="palette")
        self.labels = tf.Variable(read_labels(LABELS_PATH), trainable=False, name="labels")
        self.model_version = tf.Variable(version, dtype=tf.int64, trainable=False, name="version")


class EncodedImageClassifier(_Classifier):
    """`string_input` string [-1] (base64url images) -> `label`, `confidence` [-1]."""

    def __init__(self, version: int = 1) -> None:
        super().__init__(version, "encoded_image_classifier")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="string_input")])
    def __call__(self, string_input: tf.Tensor) -> dict[str, Any]:
        images = tf.map_fn(
            preprocess,
            string_input,
            fn_output_signature=tf.TensorSpec([IMAGE_SIZE, IMAGE_SIZE, 3], tf.float32),
        )
        shares = colour_shares(images, self.palette)
        top = tf.argmax(shares, axis=1, output_type=tf.int32)
        return {
            "label": tf.gather(self.labels, top),
            "confidence": tf.reduce_max(shares, axis=1),
        }


class ScoresClassifier(_Classifier):
    """`input_tensor` float32 [-1,224,224,3] in [0, 1] -> `probabilities` [-1,8]."""

    SHAPE = (None, IMAGE_SIZE, IMAGE_SIZE, 3)

    def __init__(self, version: int = 1) -> None:
        super().__init__(version, "scores_classifier")

    @tf.function(input_signature=[tf.TensorSpec(SHAPE, tf.float32, name="input_tensor")])
    def __call__(self, input_tensor: tf.Tensor) -> dict[str, Any]:
        images = checked_input(input_tensor, "input_tensor", self.SHAPE)
        return {"probabilities": colour_shares(images, self.palette)}


class LogitsClassifier(_Classifier):
    """`pixel_values` float32 [-1,3,224,224], normalised -> `logits` [-1,8]."""

    SHAPE = (None, 3, IMAGE_SIZE, IMAGE_SIZE)

    def __init__(self, version: int = 1) -> None:
        super().__init__(version, "logits_classifier")

    @tf.function(input_signature=[tf.TensorSpec(SHAPE, tf.float32, name="pixel_values")])
    def __call__(self, pixel_values: tf.Tensor) -> dict[str, Any]:
        nchw = checked_input(pixel_values, "pixel_values", self.SHAPE)
        images = tf.transpose(nchw, [0, 2, 3, 1]) * NORMALISE_STD + NORMALISE_MEAN
        shares = colour_shares(images, self.palette)
        return {"logits": tf.math.log(tf.maximum(shares, LOGIT_FLOOR))}
