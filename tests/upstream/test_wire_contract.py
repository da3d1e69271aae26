"""Our TF Serving wire messages (tfswire.v1) are byte-compatible with the official ones.

Each pair is checked three ways: the field tables agree (number, name, type, packing), a
message built with the official classes survives a round trip through ours byte for byte,
and a message built with ours parses in the official classes and serializes to the same bytes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import message as pb_message
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    predict_pb2,
    status_pb2,
)

from gateway.proto.tfswire.v1 import tfserving_pb2 as ours
from gateway.upstream.tensors import (
    OutputTensor,
    TensorDecodeError,
    image_tensor,
    string_tensor,
    to_array,
)

# Official fields we leave out on purpose (kept as unknown fields when they occur).
OMITTED = {
    "tensorflow.TensorProto": {14, 15},  # resource_handle_val, variant_val
    "tensorflow.serving.PredictRequest": {5, 7},  # LLM streaming/request options
    "tensorflow.TensorInfo": {4, 5},  # coo_sparse, composite_tensor
}

PAIRS = [
    (ours.TensorShapeProto, tensor_shape_pb2.TensorShapeProto),
    (ours.TensorShapeProto.Dim, tensor_shape_pb2.TensorShapeProto.Dim),
    (ours.TensorProto, tensor_pb2.TensorProto),
    (ours.ModelSpec, model_pb2.ModelSpec),
    (ours.PredictRequest, predict_pb2.PredictRequest),
    (ours.PredictResponse, predict_pb2.PredictResponse),
    (ours.TensorInfo, meta_graph_pb2.TensorInfo),
    (ours.SignatureDef, meta_graph_pb2.SignatureDef),
    (ours.SignatureDefMap, get_model_metadata_pb2.SignatureDefMap),
    (ours.GetModelMetadataRequest, get_model_metadata_pb2.GetModelMetadataRequest),
    (ours.GetModelMetadataResponse, get_model_metadata_pb2.GetModelMetadataResponse),
    (ours.GetModelStatusRequest, get_model_status_pb2.GetModelStatusRequest),
    (ours.GetModelStatusResponse, get_model_status_pb2.GetModelStatusResponse),
    (ours.ModelVersionStatus, get_model_status_pb2.ModelVersionStatus),
    (ours.StatusProto, status_pb2.StatusProto),
]

# Enums and int32 share the varint wire type, so an int32 stands in for an official enum.
_COMPATIBLE = {(5, 14), (14, 14), (5, 5)}


def _field_type(field) -> tuple[int, bool, bool]:
    return field.type, field.is_repeated, field.is_packed


@pytest.mark.parametrize(("ours_cls", "official_cls"), PAIRS, ids=lambda c: c.DESCRIPTOR.name)
def test_field_tables_agree(ours_cls, official_cls) -> None:
    mine = {f.number: f for f in ours_cls.DESCRIPTOR.fields}
    theirs = {f.number: f for f in official_cls.DESCRIPTOR.fields}
    omitted = OMITTED.get(official_cls.DESCRIPTOR.full_name, set())
    assert set(theirs) - set(mine) == omitted
    assert set(mine) <= set(theirs)
    for number, field in mine.items():
        other = theirs[number]
        assert field.name == other.name
        assert field.is_repeated == other.is_repeated
        assert field.is_packed == other.is_packed
        if field.type != other.type:
            assert (field.type, other.type) in _COMPATIBLE, field.name


def test_data_type_numbers_match() -> None:
    for value in ours.DataType.DESCRIPTOR.values:
        assert types_pb2.DataType.Value(value.name) == value.number


def test_model_version_states_match() -> None:
    official = get_model_status_pb2.ModelVersionStatus.State
    for value in ours.ModelVersionStatus.State.DESCRIPTOR.values:
        assert official.Value(value.name) == value.number


def _bytes(message: pb_message.Message) -> bytes:
    return message.SerializeToString(deterministic=True)


def _official_messages() -> list[pb_message.Message]:
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(1, 2, 3, 3)
    predict = predict_pb2.PredictRequest(output_filter=["detection_boxes", "num_detections"])
    predict.model_spec.name = "detector"
    predict.model_spec.version.value = 7
    predict.model_spec.signature_name = "serving_default"
    predict.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto(image))
    predict.inputs["encoded"].CopyFrom(tf.make_tensor_proto([b"\xff\xd8jpeg", b"png"]))
    predict.client_id = b"client-1"

    response = predict_pb2.PredictResponse()
    response.model_spec.name = "detector"
    response.model_spec.version_label = "canary"
    rng = np.random.default_rng(0)
    for key, shape in {
        "detection_boxes": (1, 100, 4),
        "detection_scores": (1, 100),
        "num_detections": (1,),
    }.items():
        tensor = response.outputs[key]
        tensor.dtype = types_pb2.DT_FLOAT
        tensor.tensor_shape.dim.extend(tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in shape)
        tensor.float_val.extend(rng.random(int(np.prod(shape))).astype(np.float32))

    every_field = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_HALF,
        version_number=3,
        tensor_content=b"\x01\x02",
        half_val=[15360, 0],
        float_val=[1.5, -2.0],
        double_val=[3.25],
        int_val=[-1, 2**31 - 1],
        string_val=[b"a", b""],
        scomplex_val=[1.0, 2.0],
        int64_val=[-(2**40)],
        bool_val=[True, False],
        dcomplex_val=[0.5, 0.25],
        uint32_val=[2**32 - 1],
        uint64_val=[2**64 - 1],
        float8_val=b"\x10",
    )
    every_field.tensor_shape.unknown_rank = True

    sig = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    sig.inputs["input_tensor"].name = "serving_default_input_tensor:0"
    sig.inputs["input_tensor"].dtype = types_pb2.DT_UINT8
    for n in (1, -1, -1, 3):
        sig.inputs["input_tensor"].tensor_shape.dim.add(size=n)
    sig.outputs["num_detections"].name = "StatefulPartitionedCall:5"
    sig.outputs["num_detections"].dtype = types_pb2.DT_FLOAT
    sig.defaults["flag"].CopyFrom(tf.make_tensor_proto(np.float32(0.5)))
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    sig_map.signature_def["serving_default"].CopyFrom(sig)
    init = sig_map.signature_def["__saved_model_init_op"]
    init.outputs["__saved_model_init_op"].name = "NoOp"
    init.outputs["__saved_model_init_op"].tensor_shape.unknown_rank = True
    metadata = get_model_metadata_pb2.GetModelMetadataResponse()
    metadata.model_spec.name = "detector"
    metadata.model_spec.version.value = 1
    metadata.metadata["signature_def"].Pack(sig_map)

    status = get_model_status_pb2.GetModelStatusResponse()
    for version, state in ((2, 30), (1, 50)):
        entry = status.model_version_status.add(version=version, state=state)
        entry.status.error_code = 0 if state == 30 else 5
        entry.status.error_message = "" if state == 30 else "unloaded"

    metadata_request = get_model_metadata_pb2.GetModelMetadataRequest(
        metadata_field=["signature_def"]
    )
    metadata_request.model_spec.name = "detector"
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "detector"
    status_request.model_spec.version_label = "stable"
    return [predict, response, every_field, metadata, status, metadata_request, status_request]


_OURS_FOR = {official.DESCRIPTOR.full_name: mine for mine, official in PAIRS}


@pytest.mark.parametrize("official", _official_messages(), ids=lambda m: m.DESCRIPTOR.name)
def test_official_message_round_trips_through_ours(official: pb_message.Message) -> None:
    wire = _bytes(official)
    mine = _OURS_FOR[official.DESCRIPTOR.full_name].FromString(wire)
    assert _bytes(mine) == wire


def _our_messages() -> list[pb_message.Message]:
    request = ours.PredictRequest(
        model_spec=ours.ModelSpec(name="detector", signature_name="serving_default"),
        output_filter=["detection_boxes"],
    )
    request.model_spec.version.value = 3
    request.inputs["input_tensor"].CopyFrom(
        image_tensor(np.random.default_rng(1).integers(0, 255, (5, 7, 3), dtype=np.uint8))
    )
    encoded = ours.PredictRequest(model_spec=ours.ModelSpec(name="detector_encoded"))
    encoded.model_spec.version_label = "canary"
    encoded.inputs["input_tensor"].CopyFrom(string_tensor([b"\x89PNG...", b"\xff\xd8..."]))
    status = ours.GetModelStatusRequest(model_spec=ours.ModelSpec(name="detector"))
    metadata = ours.GetModelMetadataRequest(
        model_spec=ours.ModelSpec(name="detector"), metadata_field=["signature_def"]
    )
    return [request, encoded, status, metadata]


_OFFICIAL_FOR = {mine.DESCRIPTOR.full_name: official for mine, official in PAIRS}


@pytest.mark.parametrize("mine", _our_messages(), ids=lambda m: m.DESCRIPTOR.name)
def test_our_message_parses_in_the_official_classes(mine: pb_message.Message) -> None:
    wire = _bytes(mine)
    official = _OFFICIAL_FOR[mine.DESCRIPTOR.full_name].FromString(wire)
    assert _bytes(official) == wire


def test_our_image_tensor_is_what_tensorflow_reads() -> None:
    pixels = np.random.default_rng(2).integers(0, 255, (6, 9, 3), dtype=np.uint8)
    official = tensor_pb2.TensorProto.FromString(image_tensor(pixels).SerializeToString())
    np.testing.assert_array_equal(tf.make_ndarray(official), pixels[None])


# Where TF Serving's default AsProtoField writes each dtype (serving/local/FACTS.md, "Tensors").
_TYPED_FIELD = {
    np.float32: "float_val",
    np.float64: "double_val",
    np.int32: "int_val",
    np.uint8: "int_val",
    np.int64: "int64_val",
    np.bool_: "bool_val",
}


@pytest.mark.parametrize("dtype", list(_TYPED_FIELD))
@pytest.mark.parametrize("as_content", [False, True])
def test_to_array_reads_what_tensorflow_serving_writes(dtype, as_content: bool) -> None:
    values = (np.random.default_rng(3).random((2, 3, 4)) * 100).astype(dtype)
    proto = tf.make_tensor_proto(values)  # raw tensor_content
    if not as_content:
        proto.ClearField("tensor_content")
        getattr(proto, _TYPED_FIELD[dtype]).extend(values.ravel().tolist())
    mine = ours.TensorProto.FromString(proto.SerializeToString())
    np.testing.assert_array_equal(to_array(mine), values)


def test_to_array_repeats_the_last_typed_value_like_tensorflow() -> None:
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0, 2.0])
    proto.tensor_shape.dim.add(size=4)
    mine = ours.TensorProto.FromString(proto.SerializeToString())
    np.testing.assert_array_equal(to_array(mine), tf.make_ndarray(proto))


@pytest.mark.parametrize("dtype", list(_TYPED_FIELD))
@pytest.mark.parametrize("given", ["all", "some", "none", "content"])
def test_output_head_reads_the_first_values_as_tensorflow_does(dtype, given: str) -> None:
    """OutputTensor.head (a detector's few used rows) gives what TensorFlow decodes, value for value
    and as Python numbers, whether the values are all there, repeat the last one given (TF's
    rule for typed fields), are absent (zeros) or come as tensor_content."""
    values = (np.random.default_rng(4).random((1, 5, 4)) * 100).astype(dtype)
    values.ravel()[12:] = values.ravel()[11]  # equal trailing values, as padding ends
    proto = tf.make_tensor_proto(values)
    if given == "content":
        proto.tensor_content = values.tobytes()  # (make_tensor_proto writes bools typed)
        proto.ClearField(_TYPED_FIELD[dtype])
    else:
        proto.ClearField("tensor_content")
        proto.ClearField(_TYPED_FIELD[dtype])
        typed = values.ravel().tolist()
        if given == "some":
            typed = typed[:12]  # TensorFlow repeats the last value given
        getattr(proto, _TYPED_FIELD[dtype]).extend([] if given == "none" else typed)
    expected = tf.make_ndarray(proto).ravel().tolist()
    output = OutputTensor(ours.TensorProto.FromString(proto.SerializeToString()))
    for count in (0, 1, 7, 20):
        head = output.head(count)
        assert head == expected[:count]
        assert [type(v) for v in head] == [type(v) for v in expected[:count]]
    np.testing.assert_array_equal(output.array(), tf.make_ndarray(proto))


def test_an_undecodable_output_fails_when_the_response_is_read() -> None:
    """OutputTensor checks everything to_array would refuse at once, so a bad tensor fails where the
    response is read (UnreadableOutput), not later in a task."""
    short = ours.TensorProto(dtype=ours.DT_FLOAT, tensor_content=b"\x00" * 8)
    short.tensor_shape.dim.add(size=3)
    strings = ours.TensorProto(dtype=ours.DT_STRING, string_val=[b"a"])
    strings.tensor_shape.dim.add(size=2)
    unknown = ours.TensorProto(dtype=ours.DT_FLOAT)
    unknown.tensor_shape.dim.add(size=-1)
    for proto, message in (
        (short, "tensor_content has 8 bytes; DT_FLOAT [3] needs 12"),
        (strings, "string tensor [2] needs 2 values, got 1"),
        (unknown, "tensor has no fully defined shape: (-1,)"),
        (ours.TensorProto(dtype=ours.DT_VARIANT), "unsupported tensor dtype DT_VARIANT"),
    ):
        with pytest.raises(TensorDecodeError, match=re.escape(message)):
            OutputTensor(proto)
