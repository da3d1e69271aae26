"""serving.local on the wire: the official tensorflow_serving.apis stubs against real models.

One server (both reference models, version 1) serves the whole module over loopback gRPC.
Detections are checked against the scenes' painted rectangles; errors against TF Serving's
codes and texts (serving/local/FACTS.md, read through tests/support/facts.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving import scenes
from tests.support.facts import fact, text
from tests.support.localserver import LocalServer, run_local_server

BOX_TOLERANCE_PX = 1
OUTPUT_KEYS = {
    "detection_boxes",
    "detection_classes",
    "detection_multiclass_scores",
    "detection_scores",
    "num_detections",
    "raw_detection_boxes",
    "raw_detection_scores",
}


@pytest.fixture(scope="module")
def tfs(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("local-server")
    model_config = directory / "models.config"
    model_config.write_text(
        "model_config_list {\n"
        + "".join(
            f"  config {{ name: '{name}' base_path: '{model_repo / name}' "
            "model_platform: 'tensorflow' }\n"
            for name in ("detector", "detector_encoded")
        )
        + "}\n"
    )
    args = [f"--model_config_file={model_config}", "--enable_grpc_healthcheck_service"]
    with run_local_server(args, log_dir=directory) as server:
        yield server


@pytest.fixture(scope="module")
def channel(tfs: LocalServer) -> Iterator[grpc.Channel]:
    with tfs.channel() as channel:
        yield channel


@pytest.fixture(scope="module")
def prediction(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def models(channel: grpc.Channel) -> model_service_pb2_grpc.ModelServiceStub:
    return model_service_pb2_grpc.ModelServiceStub(channel)


def request_for(
    model: str, value: tensor_pb2.TensorProto | None = None, **spec: object
) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, item in spec.items():
        if key == "version":
            request.model_spec.version.value = int(item)
        else:
            setattr(request.model_spec, key, item)
    if value is not None:
        request.inputs["input_tensor"].CopyFrom(value)
    return request


def image_tensor(pixels: np.ndarray) -> tensor_pb2.TensorProto:
    """uint8 [1, H, W, 3] as tensor_content (what tf.make_tensor_proto writes)."""
    return tf.make_tensor_proto(pixels[np.newaxis])


def rpc_error(call: Callable[..., object], request: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, **kwargs)
    return info.value


def assert_finds(response: predict_pb2.PredictResponse, scene: scenes.Scene) -> None:
    """Every painted rectangle is found with its class, its box within 1 px; nothing else."""
    outputs = {key: tf.make_ndarray(value) for key, value in response.outputs.items()}
    count = int(outputs["num_detections"][0])
    assert count == len(scene.boxes)
    size = np.array([scene.height, scene.width, scene.height, scene.width])
    found = sorted(
        (int(c), *np.rint(b * size).astype(int).tolist())
        for b, c in zip(
            outputs["detection_boxes"][0][:count],
            outputs["detection_classes"][0][:count],
            strict=True,
        )
    )
    truth = sorted((t.class_id, t.y_min, t.x_min, t.y_max, t.x_max) for t in scene.boxes)
    for got, want in zip(found, truth, strict=True):
        assert got[0] == want[0]
        assert np.abs(np.array(got[1:]) - np.array(want[1:])).max() <= BOX_TOLERANCE_PX
    assert (outputs["detection_scores"][0][:count] > 0.5).all()
    assert (outputs["detection_scores"][0][count:] < 0.5).all()


def scene(seed: int, width: int = 320, height: int = 240, rects: int = 4) -> scenes.Scene:
    return scenes.generate_scene(np.random.default_rng(seed), width, height, rects, noise_sigma=4)


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


# ----- GetModelMetadata -----------------------------------------------------------------------


def metadata_request(
    model: str = "detector", fields: tuple[str, ...] = ("signature_def",), version: int = 0
) -> get_model_metadata_pb2.GetModelMetadataRequest:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=list(fields))
    request.model_spec.name = model
    if version:
        request.model_spec.version.value = version
    return request


def test_metadata_packs_every_signature_def(prediction):
    response = prediction.GetModelMetadata(metadata_request())
    assert response.model_spec.name == "detector"
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == ""  # name and version only
    packed = response.metadata["signature_def"]
    assert packed.type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert packed.Unpack(signatures)
    assert set(signatures.signature_def) == {"serving_default", "__saved_model_init_op"}
    serving = signatures.signature_def["serving_default"]
    assert serving.method_name == "tensorflow/serving/predict"
    image = serving.inputs["input_tensor"]
    assert image.dtype == types_pb2.DT_UINT8
    assert [d.size for d in image.tensor_shape.dim] == [1, -1, -1, 3]
    assert set(serving.outputs) == OUTPUT_KEYS
    boxes = serving.outputs["detection_boxes"].tensor_shape.dim
    assert [d.size for d in boxes] == [-1, 100, 4] or [d.size for d in boxes] == [1, 100, 4]


def test_encoded_model_metadata_declares_a_string_input(prediction):
    response = prediction.GetModelMetadata(metadata_request("detector_encoded"))
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    image = signatures.signature_def["serving_default"].inputs["input_tensor"]
    assert image.dtype == types_pb2.DT_STRING
    assert [d.size for d in image.tensor_shape.dim] == [-1]


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (
            get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"]),
            *fact("missing_model_spec"),
        ),
        (metadata_request(fields=()), *fact("metadata_no_field")),
        (
            metadata_request(fields=("signature_def", "labels")),
            *fact("metadata_unsupported_field", field="labels"),
        ),
        (metadata_request("nope"), *fact("servable_not_found_latest", model="nope")),
        (
            metadata_request(version=3),
            *fact("servable_not_found_specific", model="detector", version=3),
        ),
    ],
    ids=["missing spec", "no field", "unknown field", "unknown model", "unknown version"],
)
def test_metadata_errors(prediction, request_, code, message):
    error = rpc_error(prediction.GetModelMetadata, request_)
    assert (error.code().name, error.details()) == (code, message)


# ----- GetModelStatus -------------------------------------------------------------------------


def status_request(model: str, **spec: object) -> get_model_status_pb2.GetModelStatusRequest:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = model
    if "version" in spec:
        request.model_spec.version.value = int(spec["version"])
    if "version_label" in spec:
        request.model_spec.version_label = str(spec["version_label"])
    return request


def test_status_reports_available_with_an_ok_status(models):
    response = models.GetModelStatus(status_request("detector"))
    assert len(response.model_version_status) == 1
    status = response.model_version_status[0]
    assert status.version == 1
    assert status.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE == 30
    assert status.status.error_code == 0
    assert status.status.error_message == ""


def test_status_ignores_version_labels(models):
    labelled = models.GetModelStatus(status_request("detector_encoded", version_label="nope"))
    plain = models.GetModelStatus(status_request("detector_encoded"))
    assert labelled == plain


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (get_model_status_pb2.GetModelStatusRequest(), *fact("missing_model_spec")),
        (status_request("nope"), *fact("status_unknown_model", model="nope")),
        (
            status_request("detector", version=9),
            *fact("status_unknown_version", version=9, model="detector"),
        ),
    ],
    ids=["missing spec", "unknown model", "unknown version"],
)
def test_status_errors(models, request_, code, message):
    error = rpc_error(models.GetModelStatus, request_)
    assert (error.code().name, error.details()) == (code, message)


# ----- health ---------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["", "ModelService", "PredictionService"])
def test_grpc_health_service_reports_serving(channel, service):
    stub = health_pb2_grpc.HealthStub(channel)
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    assert response.status == health_pb2.HealthCheckResponse.SERVING
