"""KServe's way: a custom transformer (`kserve.Model`) served by `kserve.ModelServer`.

Written as KServe's transformer docs write one: `preprocess` turns the v1 request
(`{"instances": [{"image": {"b64": ...}}]}`, TF Serving's REST convention for binary
values) into the tensor the model takes, `predict` calls the predictor and `postprocess`
turns its answer into the response. KServe's predictor protocols have no TF Serving gRPC, so
`predict` calls TF Serving's gRPC Predict itself through the official `tensorflow-serving-api`
stub (on a grpc.aio channel, as KServe's own gRPC predictor client does), which is what its
users do (kserve#1783, kserve#1420). `preprocess` and `postprocess` are plain functions, as
in the docs, so KServe runs them on its event loop.

Runs in its own venv (`make peers`; KServe 0.21 needs protobuf < 7, the project pins 7):

    PY=$(python -m bench.peers.venvs)/kserve/bin/python
    $PY -m bench.peers.kserve_transformer --model_name=pixels --http_port=8080 \\
        --grpc_port=8081 --predictor_host=127.0.0.1:8500

REST: `POST /v1/models/pixels:predict`, answer `{"predictions": [{"detections": [...],
"image_width": ..., "image_height": ..., "model": {...}}]}`.
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

import grpc
import kserve
import tensorflow as tf
from kserve.errors import InvalidInput
from PIL import UnidentifiedImageError
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bench.peers import odapi

TIMEOUT = 30.0  # seconds for each Predict


class Detector(kserve.Model):
    def __init__(self, name: str, predictor_host: str) -> None:
        super().__init__(name)
        self.predictor_host = predictor_host
        self._stub: Any = None
        self.ready = False

    def load(self) -> bool:
        self.ready = True
        return self.ready

    def _predictor(self) -> Any:
        # Made on the server's event loop (a grpc.aio channel belongs to the loop it runs on).
        if self._stub is None:
            channel = grpc.aio.insecure_channel(self.predictor_host, options=odapi.CHANNEL_OPTIONS)
            self._stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return self._stub

    def preprocess(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        try:
            data = base64.b64decode(payload["instances"][0]["image"]["b64"])
            pixels = odapi.decode(data)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise InvalidInput(
                f'expected {{"instances": [{{"image": {{"b64": ...}}}}]}}: {e}'
            ) from None
        except (UnidentifiedImageError, OSError) as e:
            raise InvalidInput(f"cannot decode the image: {e}") from None
        height, width = pixels.shape[:2]
        return {
            "request": odapi.predict_request(pixels, tf, predict_pb2),
            "width": width,
            "height": height,
        }

    async def predict(
        self,
        payload: Any,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> Any:
        response = await self._predictor().Predict(payload["request"], timeout=TIMEOUT)
        return {"response": response, "width": payload["width"], "height": payload["height"]}

    def postprocess(
        self,
        result: Any,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> Any:
        response, width, height = result["response"], result["width"], result["height"]
        return {
            "predictions": [
                {
                    "detections": odapi.detections(response, width, height),
                    "image_width": width,
                    "image_height": height,
                    "model": {
                        "name": response.model_spec.name,
                        "version": response.model_spec.version.value,
                    },
                }
            ]
        }


parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
args, _ = parser.parse_known_args()

if __name__ == "__main__":
    model = Detector(args.model_name, predictor_host=args.predictor_host)
    model.load()
    kserve.ModelServer().start([model])
