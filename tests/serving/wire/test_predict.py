"""serving.local's Predict through the official stub: detections checked against the scenes'
painted rectangles (tensor_content, typed values, encoded strings, full HD, concurrent calls)
and the response's encoding. The server is the package's (conftest.py)."""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import model_pb2, predict_pb2

from serving import scenes
from tests.support.servingcalls import OUTPUT_KEYS, assert_finds, image_tensor, request_for, scene

# ----- detections through the official stub ---------------------------------------------------


def test_detector_finds_every_rectangle_from_tensor_content(prediction):
    painted = scene(1, 640, 480, 6)
    response = prediction.Predict(request_for("detector", image_tensor(painted.pixels)))
    assert_finds(response, painted)


def test_typed_int_val_input_gives_the_same_detections(prediction):
    painted = scene(2)
    typed = tensor_pb2.TensorProto(dtype=types_pb2.DT_UINT8)
    typed.tensor_shape.CopyFrom(tf.TensorShape([1, painted.height, painted.width, 3]).as_proto())
    typed.int_val.extend(painted.pixels.ravel().tolist())
    from_typed = prediction.Predict(request_for("detector", typed))
    from_content = prediction.Predict(request_for("detector", image_tensor(painted.pixels)))
    assert_finds(from_typed, painted)
    assert from_typed.outputs == from_content.outputs


def test_typed_input_repeats_its_last_value_to_fill_the_shape(prediction):
    # One int_val for a whole 64x48 image: a uniform background, so nothing is detected.
    typed = tensor_pb2.TensorProto(dtype=types_pb2.DT_UINT8, int_val=[128])
    typed.tensor_shape.CopyFrom(tf.TensorShape([1, 48, 64, 3]).as_proto())
    response = prediction.Predict(request_for("detector", typed))
    assert tf.make_ndarray(response.outputs["num_detections"]).tolist() == [0.0]


def test_encoded_model_finds_every_rectangle_from_png_and_jpeg_string_val(prediction):
    painted = scene(3, 400, 300, 5)
    for fmt in ("PNG", "JPEG"):
        value = tf.make_tensor_proto(np.array([scenes.encode(painted.pixels, fmt)], dtype=object))
        assert value.string_val  # strings travel as string_val
        assert_finds(prediction.Predict(request_for("detector_encoded", value)), painted)


def test_full_hd_request_over_4_mib_is_accepted(prediction):
    painted = scene(4, 1920, 1080, 8)
    request = request_for("detector", image_tensor(painted.pixels))
    assert request.ByteSize() > 6_000_000
    assert_finds(prediction.Predict(request, timeout=120), painted)


def test_concurrent_requests_each_get_their_own_answer(prediction):
    painted = [scene(10 + i, 320 + 40 * i, 240, 2 + i) for i in range(4)]
    responses: dict[int, predict_pb2.PredictResponse] = {}

    def call(index: int) -> None:
        request = request_for("detector", image_tensor(painted[index].pixels))
        responses[index] = prediction.Predict(request, timeout=60)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(painted))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, expected in enumerate(painted):
        assert_finds(responses[index], expected)


# ----- response encoding ----------------------------------------------------------------------


def test_outputs_are_typed_fields_with_full_shape_and_the_resolved_model_spec(prediction):
    response = prediction.Predict(request_for("detector", image_tensor(scene(5).pixels)))
    assert set(response.outputs) == OUTPUT_KEYS
    boxes = response.outputs["detection_boxes"]
    assert boxes.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in boxes.tensor_shape.dim] == [1, 100, 4]
    assert boxes.tensor_content == b""
    assert len(boxes.float_val) == 400  # every element, no trimming of trailing zeros
    assert len(response.outputs["num_detections"].float_val) == 1
    assert response.model_spec == model_pb2.ModelSpec(
        name="detector", signature_name="serving_default", version={"value": 1}
    )


def test_output_filter_returns_only_the_named_outputs(prediction):
    request = request_for("detector", image_tensor(scene(6).pixels), version=1)
    request.output_filter.extend(["num_detections", "detection_boxes"])
    response = prediction.Predict(request)
    assert set(response.outputs) == {"num_detections", "detection_boxes"}
    assert response.model_spec.version.value == 1
