"""serving.local's errors: TF Serving's codes and texts (serving/local/FACTS.md, read through
tests/support/facts.py) for each malformed Predict, truncation, deadlines and the methods it
does not implement. The server is the package's (conftest.py)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import classification_pb2, predict_pb2

from tests.support.facts import fact, text
from tests.support.servingcalls import image_tensor, request_for, rpc_error, scene

# ----- TF Serving's error table ---------------------------------------------------------------

PIXELS = np.zeros([1, 16, 16, 3], np.uint8)


def _spec_only(model: str = "detector", **spec: object) -> predict_pb2.PredictRequest:
    return request_for(model, tf.make_tensor_proto(PIXELS), **spec)


def _inputs(**tensors: tensor_pb2.TensorProto) -> predict_pb2.PredictRequest:
    request = request_for("detector")
    for key, value in tensors.items():
        request.inputs[key].CopyFrom(value)
    return request


def _filtered(*aliases: str) -> predict_pb2.PredictRequest:
    request = _spec_only()
    request.output_filter.extend(aliases)
    return request


def _short_content() -> tensor_pb2.TensorProto:
    value = tf.make_tensor_proto(PIXELS)
    value.tensor_content = value.tensor_content[:-1]
    return value


ERROR_TABLE = [
    ("missing model_spec", predict_pb2.PredictRequest(), *fact("missing_model_spec")),
    ("empty name", _spec_only(""), *fact("no_model_name")),
    (
        "unknown model",
        _spec_only("no_such_model"),
        *fact("servable_not_found_latest", model="no_such_model"),
    ),
    (
        "unknown version",
        _spec_only(version=7),
        *fact("servable_not_found_specific", model="detector", version=7),
    ),
    (
        "unknown label",
        _spec_only(version_label="gold"),
        *fact("unknown_version_label", label="gold"),
    ),
    (
        "unknown signature",
        _spec_only(signature_name="classify"),
        *fact("unknown_signature", signature="classify"),
    ),
    (
        "extra input",
        _inputs(input_tensor=tf.make_tensor_proto(PIXELS), extra=tf.make_tensor_proto(1.0)),
        *fact(
            "input_size_mismatch",
            sent_count=2,
            signature_count=1,
            sent_keys="extra,input_tensor",
            signature_keys="input_tensor",
            extra_keys="extra",
            missing_keys="",
        ),
    ),
    (
        "no inputs",
        _inputs(),
        *fact(
            "input_size_mismatch",
            sent_count=0,
            signature_count=1,
            sent_keys="",
            signature_keys="input_tensor",
            extra_keys="",
            missing_keys="input_tensor",
        ),
    ),
    (
        "wrong input key",
        _inputs(image=tf.make_tensor_proto(PIXELS)),
        *fact(
            "input_alias_missing",
            alias="input_tensor",
            tensor_name="serving_default_input_tensor:0",
            request_keys="image",
            default_keys="",
        ),
    ),
    (
        "unknown output alias",
        _filtered("boxes"),
        *fact(
            "output_alias_missing",
            alias="boxes",
            output_keys="detection_boxes,detection_classes,detection_multiclass_scores,"
            "detection_scores,num_detections,raw_detection_boxes,raw_detection_scores",
        ),
    ),
    (
        "duplicate output alias",
        _filtered("num_detections", "num_detections"),
        *fact("output_alias_duplicate", alias="num_detections"),
    ),
    (
        "tensor_content one byte short",
        _inputs(input_tensor=_short_content()),
        *fact("tensor_parsing_error", alias="input_tensor"),
    ),
    (
        "DT_INVALID",
        _inputs(input_tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_INVALID)),
        *fact("tensor_parsing_error", alias="input_tensor"),
    ),
    (
        "float image for a uint8 input",
        _inputs(input_tensor=tf.make_tensor_proto(PIXELS.astype(np.float32))),
        *fact("wrong_dtype", index=0, signature_dtype="uint8", sent_dtype="float"),
    ),
]


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [row[1:] for row in ERROR_TABLE],
    ids=[row[0] for row in ERROR_TABLE],
)
def test_predict_errors_have_tf_servings_code_and_text(prediction, request_, code, message):
    error = rpc_error(prediction.Predict, request_)
    assert (error.code().name, error.details()) == (code, message)


def test_bad_shape_is_invalid_argument_from_the_graph(prediction):
    error = rpc_error(prediction.Predict, _inputs(input_tensor=tf.make_tensor_proto(PIXELS[0])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rank" in error.details()
    # The server survives a malformed tensor and keeps serving.
    assert prediction.Predict(_spec_only()).model_spec.version.value == 1


def test_messages_over_1024_characters_are_truncated(prediction):
    error = rpc_error(prediction.Predict, _filtered("x" * 2000))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == text("output_alias_missing", alias="x" * 2000, output_keys="")[
        :1024
    ] + text("truncated_suffix")


def test_deadline_shorter_than_the_run_is_deadline_exceeded(prediction):
    big = scene(7, 1920, 1080, 8)
    error = rpc_error(
        prediction.Predict, request_for("detector", image_tensor(big.pixels)), timeout=0.05
    )
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert prediction.Predict(_spec_only(), timeout=30).outputs


def test_classify_is_unimplemented_with_a_reason(prediction):
    error = rpc_error(prediction.Classify, classification_pb2.ClassificationRequest())
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "use Predict" in error.details()
