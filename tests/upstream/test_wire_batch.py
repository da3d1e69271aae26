"""The batched PredictRequests gateway.upstream.wire builds by hand (gateway.core.coalescer
sends them) are the messages the official tensorflow-serving-api classes describe: parsed
with them, they equal the request built with the official classes and tf.make_tensor_proto,
field for field, and serialize (deterministically) to the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from gateway.domain import ModelRef
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import request_envelope
from gateway.upstream.wire import (
    batch_request,
    predict_request,
    string_batch_request,
    string_request,
)


def _official(model: ModelRef, output_filter: list[str], key: str, tensor) -> bytes:
    request = predict_pb2.PredictRequest(output_filter=output_filter)
    request.model_spec.name = model.name
    request.model_spec.signature_name = "serving_default"
    if model.version is not None:
        request.model_spec.version.value = model.version
    if model.label is not None:
        request.model_spec.version_label = model.label
    request.inputs[key].CopyFrom(tensor)
    return request.SerializeToString(deterministic=True)


def _parsed(wire: bytes) -> predict_pb2.PredictRequest:
    return predict_pb2.PredictRequest.FromString(wire)


def _single(envelope: bytes, key: str, dtype: int, image: np.ndarray) -> bytes:
    buffer = predict_request(envelope, key, dtype, (1, *image.shape), image.nbytes)
    buffer.payload[:] = image.tobytes()
    return buffer.data


@pytest.mark.parametrize(
    ("dtype", "np_dtype", "item_shape"),
    [
        (tfs.DT_UINT8, np.uint8, (5, 7, 3)),
        (tfs.DT_FLOAT, np.float32, (3, 4, 6)),  # NCHW
    ],
)
@pytest.mark.parametrize("count", [1, 2, 5])
def test_a_pixel_batch_is_the_official_request_of_the_stacked_images(
    dtype: int, np_dtype: type, item_shape: tuple[int, ...], count: int
) -> None:
    rng = np.random.default_rng(count)
    images = [(rng.random(item_shape) * 255).astype(np_dtype) for _ in range(count)]
    model = ModelRef("classifier", version=3)
    envelope = request_envelope(model, ["probabilities"])
    # Each image's own request, as gateway.core.inputs builds it; the batch takes its tail.
    singles = [_single(envelope, "input_tensor", dtype, image) for image in images]
    tails = [memoryview(wire)[-image.nbytes :] for wire, image in zip(singles, images, strict=True)]
    wire = batch_request(envelope, "input_tensor", dtype, item_shape, tails)
    expected = _official(
        model, ["probabilities"], "input_tensor", tf.make_tensor_proto(np.stack(images))
    )
    assert _parsed(wire) == _parsed(expected)
    assert _parsed(wire).SerializeToString(deterministic=True) == expected
    np.testing.assert_array_equal(
        tf.make_ndarray(_parsed(wire).inputs["input_tensor"]), np.stack(images)
    )


@pytest.mark.parametrize("count", [1, 3])
def test_a_string_batch_is_the_official_request_of_the_values(count: int) -> None:
    # Values of several lengths: varint lengths of one and two bytes.
    values = [b"\xff\xd8" + bytes([i]) * (60 + 70 * i) for i in range(count)]
    model = ModelRef("detector_encoded", label="canary")
    envelope = request_envelope(model, ["detection_boxes", "num_detections"])
    singles = [string_request(envelope, "input_tensor", value) for value in values]
    tails = [memoryview(wire)[-len(value) :] for wire, value in zip(singles, values, strict=True)]
    wire = string_batch_request(envelope, "input_tensor", tails)
    tensor = tf.make_tensor_proto(values, dtype=tf.string, shape=[count])
    expected = _official(model, ["detection_boxes", "num_detections"], "input_tensor", tensor)
    assert _parsed(wire) == _parsed(expected)
    assert _parsed(wire).SerializeToString(deterministic=True) == expected


def test_a_batch_over_four_megabytes_is_written_in_place_intact() -> None:
    # The size where wire asks for huge pages: the copy into the buffer must still be exact.
    images = [np.full((512, 512, 3), i, np.uint8) for i in range(6)]
    envelope = request_envelope(ModelRef("m"), [])
    tails = [memoryview(image.tobytes()) for image in images]
    wire = batch_request(envelope, "x", tfs.DT_UINT8, (512, 512, 3), tails)
    sent = tf.make_ndarray(_parsed(wire).inputs["x"])
    assert sent.shape == (6, 512, 512, 3)
    assert [int(sent[i, 100, 100, 0]) for i in range(6)] == list(range(6))
