"""serving.local's model service and health: GetModelMetadata (every signature packed), its
errors, GetModelStatus and the gRPC health service. The server is the package's (conftest.py)."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from tests.support.facts import fact
from tests.support.servingcalls import OUTPUT_KEYS, rpc_error

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
