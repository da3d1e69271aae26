"""MLServer's way: a custom inference runtime (`mlserver.MLModel`) started by `mlserver start`.

Written as MLServer's custom-runtime docs write one: `load` reads the model settings,
`predict` takes an Open Inference Protocol request and answers with named tensors through
MLServer's codecs. The image comes as one BYTES element (raw over gRPC `ModelInfer`, base64
over REST with `"parameters": {"content_type": "base64"}`); `predict` calls TF Serving's gRPC
Predict through the official `tensorflow-serving-api` stub on a grpc.aio channel (MLServer
runs `predict` on an event loop) and answers `boxes` (INT32 [N,4]: x_min, y_min, x_max,
y_max in pixels), `class_ids` (INT32 [N]), `labels` (BYTES [N]), `scores` (FP32 [N]) and
`image_size` (INT32 [2]: width, height). Server settings are MLServer's defaults but for
the ports, so inference runs in one parallel worker process beside the server process.

Runs in its own venv (`make peers`: MLServer 1.7 needs protobuf < 7, the project pins 7),
started by bench/peers/mlserver_tool.py.
"""

from __future__ import annotations

import grpc
import numpy as np
import tensorflow as tf
from mlserver import MLModel
from mlserver.codecs import Base64Codec, NumpyCodec, StringCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse
from PIL import UnidentifiedImageError
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bench.peers import odapi

TIMEOUT = 30.0  # seconds for each Predict


class Detector(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else None
        channel = grpc.aio.insecure_channel(
            (extra or {})["upstream"], options=odapi.CHANNEL_OPTIONS
        )
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        # Base64Codec hands raw bytes (gRPC) back unchanged and decodes base64 (REST).
        images = self.decode(payload.inputs[0], default_codec=Base64Codec)
        try:
            pixels = odapi.decode(images[0])
        except (UnidentifiedImageError, OSError) as e:
            raise InferenceError(f"cannot decode the image: {e}") from None
        height, width = pixels.shape[:2]
        request = odapi.predict_request(pixels, tf, predict_pb2)
        response = await self._stub.Predict(request, timeout=TIMEOUT)
        found = odapi.detections(response, width, height)
        boxes = [[d["box"][k] for k in ("x_min", "y_min", "x_max", "y_max")] for d in found]
        return InferenceResponse(
            model_name=self.name,
            model_version=str(response.model_spec.version.value),
            outputs=[
                NumpyCodec.encode_output("boxes", np.array(boxes, np.int32).reshape(-1, 4)),
                NumpyCodec.encode_output(
                    "class_ids", np.array([d["class_id"] for d in found], np.int32)
                ),
                StringCodec.encode_output("labels", [d["label"] for d in found]),
                NumpyCodec.encode_output(
                    "scores", np.array([d["score"] for d in found], np.float32)
                ),
                NumpyCodec.encode_output("image_size", np.array([width, height], np.int32)),
            ],
        )
