"""The three served RPCs as plain functions: request proto in, response proto out.

Checks run in TF Serving's order (predict_impl.cc, get_model_metadata_impl.cc,
get_model_status_impl.cc); failures raise ServingError, which `servicers.py` turns into
gRPC statuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    predict_pb2,
)

from serving.local.errors import invalid_argument, not_found
from serving.local.manager import ModelManager, VersionStatus
from serving.local.predict import run_predict

SIGNATURE_DEF_FIELD = "signature_def"


@dataclass(frozen=True)
class CoreOptions:
    """Request-handling switches from the flags."""

    as_tensor_content: bool = False
    check_method_name: bool = False


class ServingCore:
    """Predict, GetModelMetadata and GetModelStatus over a ModelManager."""

    def __init__(self, manager: ModelManager, options: CoreOptions) -> None:
        self.manager = manager
        self._options = options

    def predict(
        self, request: predict_pb2.PredictRequest, timeout_ms: int | None
    ) -> predict_pb2.PredictResponse:
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        with self.manager.servable(request.model_spec) as servable:
            return run_predict(
                servable,
                request,
                timeout_ms=timeout_ms,
                as_tensor_content=self._options.as_tensor_content,
                check_method_name=self._options.check_method_name,
            )

    def get_model_metadata(
        self, request: get_model_metadata_pb2.GetModelMetadataRequest
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        if not request.metadata_field:
            raise invalid_argument(
                "GetModelMetadataRequest must specify at least one metadata_field"
            )
        for metadata_field in request.metadata_field:
            if metadata_field != SIGNATURE_DEF_FIELD:
                raise invalid_argument(f"Metadata field {metadata_field} is not supported")
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        with self.manager.servable(request.model_spec) as servable:
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, signature in servable.signatures.items():
                signature_map.signature_def[key].CopyFrom(signature)
            response.model_spec.name = servable.name
            response.model_spec.version.value = servable.version
        response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
        return response

    def get_model_status(
        self, request: get_model_status_pb2.GetModelStatusRequest
    ) -> get_model_status_pb2.GetModelStatusResponse:
        if not request.HasField("model_spec"):
            raise invalid_argument("Missing ModelSpec")
        spec = request.model_spec
        states = self.manager.version_states(spec.name)
        if spec.HasField("version"):
            version = spec.version.value
            if version not in states:
                raise not_found(f"Could not find version {version} of model {spec.name}")
            states = {version: states[version]}
        elif not states:
            raise not_found(f"Could not find any versions of model {spec.name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for version, status in states.items():
            _add_version_status(response, version, status)
        return response


def _add_version_status(
    response: get_model_status_pb2.GetModelStatusResponse, version: int, status: VersionStatus
) -> None:
    entry = response.model_version_status.add(version=version, state=status.state)
    if status.error is not None:
        entry.status.error_code = status.error.code.value[0]
        entry.status.error_message = status.error.message
