"""Seed 002's gateway: the typed gRPC API as a synchronous grpcio server in front of TF Serving.

What a team writes first, and what seed 002 describes: `grpc.server` with a thread pool (the
size gRPC's Python examples use), each Detect decodes the image with Pillow, builds the
request with `tf.make_tensor_proto`, calls TF Serving's Predict through the official
`tensorflow-serving-api` stub and reads the outputs with `np.array(float_val)`
(bench/peers/odapi.py). It serves the same `detection.v1.DetectionService/Detect` as the
gateway, with the same answer, so the same load reaches both.

Runs in the project's own venv (TensorFlow and tensorflow-serving-api are its dev
dependencies):

    python -m bench.peers.seed002 --port 8600 --upstream 127.0.0.1:8500
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import tensorflow as tf
from PIL import UnidentifiedImageError
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bench.peers import odapi
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc

THREADS = 10  # gRPC's Python examples: futures.ThreadPoolExecutor(max_workers=10)
TIMEOUT = 30.0  # seconds for each Predict


class Detector(detection_pb2_grpc.DetectionServiceServicer):
    def __init__(self, upstream: str) -> None:
        channel = grpc.insecure_channel(upstream, options=odapi.CHANNEL_OPTIONS)
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def Detect(self, request: pb.DetectRequest, context: grpc.ServicerContext) -> Any:
        try:
            pixels = odapi.decode(request.image)
        except (UnidentifiedImageError, OSError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot decode the image: {e}")
        height, width = pixels.shape[:2]
        predict = odapi.predict_request(pixels, tf, predict_pb2)
        try:
            response = self.stub.Predict(predict, timeout=TIMEOUT)
        except grpc.RpcError as e:
            context.abort(e.code(), f"TF Serving: {e.details()}")
        result = pb.DetectionResult(image_width=width, image_height=height)
        result.model.name = response.model_spec.name
        result.model.version = response.model_spec.version.value
        for found in odapi.detections(response, width, height):
            detection = result.detections.add(
                class_id=found["class_id"], label=found["label"], score=found["score"]
            )
            box = found["box"]
            detection.box.x_min, detection.box.y_min = box["x_min"], box["y_min"]
            detection.box.x_max, detection.box.y_max = box["x_max"], box["y_max"]
        return result

    def DetectStream(
        self, requests: Iterator[pb.DetectRequest], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        for request in requests:
            yield self.Detect(request, context)


def serve(port: int, upstream: str) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=THREADS), options=odapi.CHANNEL_OPTIONS
    )
    detection_pb2_grpc.add_DetectionServiceServicer_to_server(Detector(upstream), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5).wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    serve(args.port, args.upstream)


if __name__ == "__main__":
    main()
