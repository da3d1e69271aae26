"""MLServer's way of classifying with adaptive batching: a custom runtime (`mlserver.MLModel`)
for bench/batching.py, beside the detector of mlserver_runtime.py.

MLServer's adaptive batching (`max_batch_size`, `max_batch_time` in model-settings.json, its
documented settings) merges the requests that arrive within the batch time into one call of
`predict`, stacking their inputs along the first dimension, and splits the outputs back per
request. So `predict` gets N encoded images as one BYTES input [N], decodes and resizes each
to 224x224 with Pillow (bilinear, as Keras' loaders do), sends one TF Serving Predict of
uint8 [N,224,224,3] to the model `classifier` (bench/upstream.py) through the official
`tensorflow-serving-api` stub, and answers each image's top 5 as `class_ids` (INT32 [N,5])
and `scores` (FP32 [N,5]).

Runs in MLServer's venv (`make peers`), started by bench/peers/mlserver_tool.py.
"""

from __future__ import annotations

import io

import grpc
import numpy as np
import tensorflow as tf
from mlserver import MLModel
from mlserver.codecs import Base64Codec, NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse
from PIL import Image, UnidentifiedImageError
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bench.peers import odapi

MODEL = "classifier"  # bench/upstream.py's uint8 [-1,224,224,3] classifier
SIDE = 224
TOP_K = 5
TIMEOUT = 30.0  # seconds for each Predict


def pixels(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(image.resize((SIDE, SIDE), Image.Resampling.BILINEAR))


class Classifier(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else None
        channel = grpc.aio.insecure_channel(
            (extra or {})["upstream"], options=odapi.CHANNEL_OPTIONS
        )
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        images = self.decode(payload.inputs[0], default_codec=Base64Codec)
        try:
            batch = np.stack([pixels(image) for image in images])
        except (UnidentifiedImageError, OSError) as e:
            raise InferenceError(f"cannot decode an image: {e}") from None
        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL
        request.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto(batch))
        response = await self._stub.Predict(request, timeout=TIMEOUT)
        scores = tf.make_ndarray(response.outputs["probabilities"])
        top = np.argsort(-scores, axis=1)[:, :TOP_K]
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                NumpyCodec.encode_output("class_ids", top.astype(np.int32)),
                NumpyCodec.encode_output(
                    "scores", np.take_along_axis(scores, top, axis=1).astype(np.float32)
                ),
            ],
        )
