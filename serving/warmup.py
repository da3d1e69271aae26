"""TF Serving warmup files: a TFRecord of PredictionLog records in assets.extra/.

TF Serving replays these requests when it loads a version (serving/local/FACTS.md, warmup),
so the first real request does not pay for lazy initialisation. At most 1000 records are
allowed. Each reference model gets requests in its own input form (`warmup_requests`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from serving import scenes
from serving.classifier import IMAGE_SIZE as CLASSIFIER_SIZE
from serving.detector import FIXED_SIZE
from serving.embedder import IMAGE_SIZE as EMBEDDER_SIZE
from serving.pose import INPUT_SIZE as POSE_SIZE
from serving.reference import CLASSIFIER_PALETTE

WARMUP_FILENAME = "tf_serving_warmup_requests"
# TF Serving refuses a warmup file with more records than this (kMaxNumRecords).
MAX_WARMUP_RECORDS = 1000
SIGNATURE_NAME = "serving_default"
INPUT_KEY = "input_tensor"

# (width, height, rectangles, noise sigma, encoding for the encoded-image model). A couple of
# sizes, so that warmup exercises more than one shape; small, so that warmup stays fast.
_SAMPLE_SCENES: tuple[tuple[int, int, int, float, str], ...] = (
    (320, 240, 3, 0.0, "PNG"),
    (640, 480, 6, 8.0, "JPEG"),
    (1280, 720, 8, 4.0, "PNG"),
)
# (width, height, encoding) of the classifiers' warmup images.
_CLASSIFIER_SAMPLES: tuple[tuple[int, int, Literal["PNG", "JPEG"]], ...] = (
    (320, 240, "PNG"),
    (640, 480, "JPEG"),
    (97, 1203, "PNG"),
)

Sample = tuple[np.ndarray, bytes]  # (uint8 pixels, encoded image)
# How the index-th sample image becomes one input value.
ToInput = Callable[[int, Sample], np.ndarray]


def sample_images(seed: int = 20240601) -> list[tuple[np.ndarray, bytes]]:
    """The detectors' warmup scenes: (uint8 HxWx3 pixels, encoded bytes), deterministic in
    `seed`."""
    rng = np.random.default_rng(seed)
    samples = []
    for width, height, n_rects, sigma, fmt in _SAMPLE_SCENES:
        scene = scenes.generate_scene(rng, width, height, n_rects, noise_sigma=sigma)
        encoded = scenes.encode(scene.pixels, "JPEG" if fmt == "JPEG" else "PNG")
        samples.append((scene.pixels, encoded))
    return samples


def fixed_size_samples(seed: int = 20240602) -> list[tuple[np.ndarray, bytes]]:
    """Warmup scenes for the fixed-size detector, all FIXED_SIZE x FIXED_SIZE."""
    rng = np.random.default_rng(seed)
    samples = []
    for n_rects, sigma in ((3, 0.0), (6, 6.0)):
        scene = scenes.generate_scene(rng, FIXED_SIZE, FIXED_SIZE, n_rects, noise_sigma=sigma)
        samples.append((scene.pixels, scenes.encode(scene.pixels, "PNG")))
    return samples


def classifier_samples(seed: int = 20240603) -> list[tuple[np.ndarray, bytes]]:
    """The classifiers' warmup images: colour bands of several sizes, PNG and JPEG."""
    rng = np.random.default_rng(seed)
    samples = []
    for width, height, fmt in _CLASSIFIER_SAMPLES:
        image = scenes.generate_colour_image(rng, width, height, CLASSIFIER_PALETTE)
        samples.append((image.pixels, scenes.encode(image.pixels, fmt)))
    return samples


def pose_samples(seed: int = 20240604) -> list[tuple[np.ndarray, bytes]]:
    """The keypoint model's warmup scenes, POSE_SIZE x POSE_SIZE."""
    rng = np.random.default_rng(seed)
    samples = []
    for n_rects, sigma in ((2, 0.0), (5, 6.0)):
        scene = scenes.generate_scene(rng, POSE_SIZE, POSE_SIZE, n_rects, noise_sigma=sigma)
        samples.append((scene.pixels, scenes.encode(scene.pixels, "PNG")))
    return samples


def unit_input(pixels: np.ndarray, size: int | None = None) -> np.ndarray:
    """float32 [1, size, size, 3] in [0, 1] (resized when `size` is given)."""
    if size is not None:
        pixels = scenes.resize(pixels, size, size)
    return (pixels.astype(np.float32) / np.float32(255.0))[np.newaxis]


def scores_input(pixels: np.ndarray) -> np.ndarray:
    """`classifier_scores` input for one image: float32 [1, 224, 224, 3] in [0, 1]."""
    resized = scenes.resize(pixels, CLASSIFIER_SIZE, CLASSIFIER_SIZE)
    return (resized.astype(np.float32) / np.float32(255.0))[np.newaxis]


def logits_input(pixels: np.ndarray) -> np.ndarray:
    """`classifier_logits` input for one image: float32 [1, 3, 224, 224], (x/255 - 0.5)/0.5."""
    normalised = (scores_input(pixels) - np.float32(0.5)) / np.float32(0.5)
    return np.ascontiguousarray(normalised.transpose(0, 3, 1, 2))


def base64url(encoded: bytes, padding: bool = True) -> bytes:
    """Web-safe base64 (tf.io.decode_base64's alphabet), with or without '=' padding."""
    text = base64.urlsafe_b64encode(encoded)
    return text if padding else text.rstrip(b"=")


def make_request(
    model_name: str, input_value: np.ndarray, input_key: str = INPUT_KEY
) -> predict_pb2.PredictRequest:
    """A Predict request for the serving_default signature with one input."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = SIGNATURE_NAME
    # make_tensor_proto puts numeric arrays in tensor_content (compact) and strings in
    # string_val, the encodings a real client would send.
    request.inputs[input_key].CopyFrom(tf.make_tensor_proto(input_value))
    return request


def _strings(*values: bytes) -> np.ndarray:
    return np.array(values, dtype=object)


# Model name -> (input alias, the sample images, how one sample becomes the input value).
_WARMUP_INPUTS: dict[str, tuple[str, Callable[[], list[Sample]], ToInput]] = {
    "detector": (INPUT_KEY, sample_images, lambda i, s: s[0][np.newaxis]),
    "detector_encoded": (INPUT_KEY, sample_images, lambda i, s: _strings(s[1])),
    "detector_fixed": (INPUT_KEY, fixed_size_samples, lambda i, s: s[0][np.newaxis]),
    "detector_float": (
        INPUT_KEY,
        sample_images,
        lambda i, s: s[0][np.newaxis].astype(np.float32),
    ),
    # Every other image without base64 padding: the model takes both.
    "classifier": (
        "string_input",
        classifier_samples,
        lambda i, s: _strings(base64url(s[1], padding=i % 2 == 0)),
    ),
    "classifier_scores": (INPUT_KEY, classifier_samples, lambda i, s: scores_input(s[0])),
    "classifier_logits": ("pixel_values", classifier_samples, lambda i, s: logits_input(s[0])),
    "maskrcnn": (INPUT_KEY, sample_images, lambda i, s: s[0][np.newaxis]),
    "pose": ("images", pose_samples, lambda i, s: unit_input(s[0])),
    "embedder": ("inputs", classifier_samples, lambda i, s: unit_input(s[0], EMBEDDER_SIZE)),
}


def warmup_requests(model_name: str) -> list[predict_pb2.PredictRequest]:
    """One request per sample image, in the input form of reference model `model_name`."""
    if model_name not in _WARMUP_INPUTS:
        raise ValueError(f"no warmup inputs for model {model_name!r}")
    input_key, samples, to_input = _WARMUP_INPUTS[model_name]
    return [
        make_request(model_name, to_input(index, sample), input_key)
        for index, sample in enumerate(samples())
    ]


def write_warmup_file(path: Path, requests: Sequence[predict_pb2.PredictRequest]) -> None:
    """Writes `requests` as PredictionLog records (predict_log.request) to a TFRecord file."""
    if len(requests) > MAX_WARMUP_RECORDS:
        raise ValueError(
            f"{len(requests)} warmup records; TF Serving accepts at most {MAX_WARMUP_RECORDS}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for request in requests:
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())


def read_warmup_file(path: Path) -> list[prediction_log_pb2.PredictionLog]:
    """Parses every record of a warmup file back into PredictionLog messages."""
    records: Iterable[tf.Tensor] = tf.data.TFRecordDataset(str(path))
    logs = []
    for record in records:
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record.numpy())
        logs.append(log)
    return logs
