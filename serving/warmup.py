"""TF Serving warmup files: a TFRecord of PredictionLog records in assets.extra/.

TF Serving replays these requests when it loads a version (tfserving.md §4), so the first
real request does not pay for lazy initialisation. At most 1000 records are allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from serving import scenes

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


def sample_images(seed: int = 20240601) -> list[tuple[np.ndarray, bytes]]:
    """The warmup scenes: (uint8 HxWx3 pixels, encoded bytes) pairs, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    samples = []
    for width, height, n_rects, sigma, fmt in _SAMPLE_SCENES:
        scene = scenes.generate_scene(rng, width, height, n_rects, noise_sigma=sigma)
        encoded = scenes.encode(scene.pixels, "JPEG" if fmt == "JPEG" else "PNG")
        samples.append((scene.pixels, encoded))
    return samples


def make_request(model_name: str, input_value: np.ndarray) -> predict_pb2.PredictRequest:
    """A Predict request for the serving_default signature with one `input_tensor` input."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = SIGNATURE_NAME
    # make_tensor_proto puts numeric arrays in tensor_content (compact) and strings in
    # string_val, the encodings a real client would send.
    request.inputs[INPUT_KEY].CopyFrom(tf.make_tensor_proto(input_value))
    return request


def warmup_requests(model_name: str, encoded_input: bool) -> list[predict_pb2.PredictRequest]:
    """Requests for every sample scene: uint8 [1, H, W, 3] images or string [1] image bytes."""
    requests = []
    for pixels, encoded in sample_images():
        value = np.array([encoded], dtype=object) if encoded_input else pixels[np.newaxis]
        requests.append(make_request(model_name, value))
    return requests


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
