"""An in-process TF Serving built from the official tensorflow-serving-api messages.

Each model has a signature and a function from its input arrays to its output arrays; every
Predict is parsed with the official PredictRequest and tf.make_ndarray (so the gateway's
hand-built requests are checked byte-compatible on every call), recorded with its metadata,
and answered like TF Serving (NOT_FOUND for unknown models, INVALID_ARGUMENT for a wrong
input dtype). Serves on 127.0.0.1, a free port.

For tests of calls in flight: while `gate` is an unset asyncio.Event, every Predict waits for
it (`in_predict` counts those waiting); a model's compute may raise Rejected to answer with a
status, as TF Serving refuses a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

Arrays = Mapping[str, np.ndarray]


class Rejected(Exception):
    """Raised by a FakeModel's compute: the Predict is answered with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@dataclass
class FakeModel:
    name: str
    inputs: dict[str, tuple[tf.dtypes.DType, list[int]]]
    outputs: dict[str, tuple[tf.dtypes.DType, list[int]]]
    compute: Callable[[Arrays], dict[str, np.ndarray]]
    version: int = 1


@dataclass
class Call:
    model: str
    inputs: dict[str, np.ndarray]
    output_filter: list[str]
    metadata: dict[str, str]


@dataclass
class FakeServing:
    models: dict[str, FakeModel]
    calls: list[Call] = field(default_factory=list)
    metadata_calls: list[dict[str, str]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    in_predict: int = 0

    async def start(self) -> str:
        self._server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            _Prediction(self), self._server
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_Status(self), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        await self._server.stop(0)

    def find(self, name: str) -> FakeModel | None:
        return self.models.get(name)


def _tensor_info(dtype: tf.dtypes.DType, shape: list[int]) -> meta_graph_pb2.TensorInfo:
    info = meta_graph_pb2.TensorInfo(dtype=dtype.as_datatype_enum)
    for n in shape:
        info.tensor_shape.dim.add(size=n)
    return info


class _Prediction(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, serving: FakeServing) -> None:
        self._serving = serving

    async def Predict(self, request: predict_pb2.PredictRequest, context):
        model = self._serving.find(request.model_spec.name)
        if model is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"Servable not found for request: Latest({request.model_spec.name})",
            )
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        for key, (dtype, _) in model.inputs.items():
            got = request.inputs[key].dtype
            if got != dtype.as_datatype_enum:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Expects arg[0] to be {dtype.name} but {tf.as_dtype(got).name} is provided",
                )
        self._serving.calls.append(
            Call(
                model.name,
                inputs,
                list(request.output_filter),
                dict(context.invocation_metadata() or ()),
            )
        )
        gate = self._serving.gate
        if gate is not None:
            self._serving.in_predict += 1
            try:
                await gate.wait()
            finally:
                self._serving.in_predict -= 1
        try:
            outputs = model.compute(inputs)
        except Rejected as e:
            await context.abort(e.code, e.details)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = model.name
        response.model_spec.version.value = model.version
        response.model_spec.signature_name = "serving_default"
        for key, value in outputs.items():
            if not request.output_filter or key in request.output_filter:
                response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
        return response

    async def GetModelMetadata(self, request, context):
        self._serving.metadata_calls.append(dict(context.invocation_metadata() or ()))
        model = self._serving.find(request.model_spec.name)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "Servable not found")
        signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
        for key, (dtype, shape) in model.inputs.items():
            signature.inputs[key].CopyFrom(_tensor_info(dtype, shape))
        for key, (dtype, shape) in model.outputs.items():
            signature.outputs[key].CopyFrom(_tensor_info(dtype, shape))
        signatures = get_model_metadata_pb2.SignatureDefMap()
        signatures.signature_def["serving_default"].CopyFrom(signature)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = model.name
        response.model_spec.version.value = model.version
        response.metadata["signature_def"].Pack(signatures)
        return response


class _Status(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, serving: FakeServing) -> None:
        self._serving = serving

    async def GetModelStatus(self, request, context):
        response = get_model_status_pb2.GetModelStatusResponse()
        model = self._serving.find(request.model_spec.name)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "Could not find any versions")
        status = response.model_version_status.add(version=model.version)
        status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        return response
