"""A fast stand-in for TF Serving that answers every Predict with fixed OD API outputs.

For measuring the gateway's own cost: a real model's time would drown it, and whatever the
upstream costs is paid equally by the direct and the gateway path. It speaks TF Serving's RPC
paths and messages: GetModelStatus (AVAILABLE), GetModelMetadata and Predict. Four models:
`pixels` (uint8 [1,-1,-1,3] input) and `encoded` (string [-1]), both with an OD API signature,
`classifier` (uint8 [-1,224,224,3] in, `probabilities` [-1,1000] out: a fixed-size
classifier whose batch dimension is free, for bench/batching.py), and `segmenter` (string
[-1] in, a Mask R-CNN layout out: 100 whole-image instances with 28x28 masks of noise, the
worst a caller can ask of the gateway's mask pasting: bench/cost.py).

The detectors' Predict requests are not parsed (the fixed answer does not depend on them);
the classifier's are, for the number of images in the batch, and it answers one row of
scores per image. Their bytes are counted where they arrive, and `/bench.Upstream/Stats`
answers the counts so far ("<requests> <bytes> <classifier calls> <classifier images>",
ASCII), so a run reports what the gateway really sent per image.

    python -m bench.upstream --port 8500 [--delay-ms 20]

`--delay-ms` answers each Predict that much later without using CPU, as a model's time on
TF Serving would (bench/fairness.py: callers sharing a gateway in front of a model).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

import grpc
import numpy as np

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.detection import BOXES, CLASSES, NUM_DETECTIONS, SCORES
from gateway.upstream.client import GET_MODEL_METADATA, GET_MODEL_STATUS, PREDICT
from gateway.upstream.signatures import SIGNATURE, SIGNATURE_DEF_MAP_TYPE

MODELS = {
    "pixels": (tfs.DT_UINT8, (-1, -1, -1, 3)),
    "encoded": (tfs.DT_STRING, (-1,)),
    "classifier": (tfs.DT_UINT8, (-1, 224, 224, 3)),
    "segmenter": (tfs.DT_STRING, (-1,)),
}
SEGMENTER = "segmenter"
CLASSIFIER = "classifier"
SCORES_PER_IMAGE = 1000  # the classifier's scores per image
PROBABILITIES = "probabilities"
VERSION = 1
DETECTIONS = 100  # rows per output, as the OD API pads them
STATS = "/bench.Upstream/Stats"  # raw bytes in and out: b"<requests> <bytes> <c> <i>"
FOUND = 5  # num_detections


def _shape(dims: tuple[int, ...]) -> tfs.TensorShapeProto:
    return tfs.TensorShapeProto(dim=[tfs.TensorShapeProto.Dim(size=d) for d in dims])


def _float_tensor(values: np.ndarray) -> tfs.TensorProto:
    # float_val, as TF Serving sends by default (tensor_content needs a server flag).
    return tfs.TensorProto(
        dtype=tfs.DT_FLOAT,
        tensor_shape=_shape(values.shape),
        float_val=values.astype(np.float32).ravel().tolist(),
    )


def outputs() -> dict[str, np.ndarray]:
    """Fixed detections: FOUND boxes with descending scores, the rest zero padding."""
    rng = np.random.default_rng(7)
    boxes = np.zeros((1, DETECTIONS, 4), np.float32)
    corner = rng.uniform(0.05, 0.5, (FOUND, 2))
    boxes[0, :FOUND, :2] = corner
    boxes[0, :FOUND, 2:] = corner + rng.uniform(0.1, 0.4, (FOUND, 2))
    scores = np.zeros((1, DETECTIONS), np.float32)
    scores[0, :FOUND] = np.linspace(0.95, 0.55, FOUND)
    classes = np.ones((1, DETECTIONS), np.float32)
    classes[0, :FOUND] = np.arange(1, FOUND + 1)
    return {
        BOXES: boxes,
        SCORES: scores,
        CLASSES: classes,
        NUM_DETECTIONS: np.array([FOUND], np.float32),
    }


def segments() -> dict[str, np.ndarray]:
    """DETECTIONS whole-image instances, scores descending, masks of noise."""
    rng = np.random.default_rng(42)
    return {
        BOXES: np.tile(np.array([0.0, 0.0, 1.0, 1.0], np.float32), (1, DETECTIONS, 1)),
        SCORES: np.linspace(0.99, 0.5, DETECTIONS, dtype=np.float32)[None],
        CLASSES: np.ones((1, DETECTIONS), np.float32),
        NUM_DETECTIONS: np.array([DETECTIONS], np.float32),
        "detection_masks": rng.random((1, DETECTIONS, 28, 28)).astype(np.float32),
    }


def _answer(model: str, images: int = 1) -> dict[str, np.ndarray]:
    if model == CLASSIFIER:
        return {PROBABILITIES: scores(images)}
    return segments() if model == SEGMENTER else outputs()


def scores(images: int) -> np.ndarray:
    """The classifier's answer: fixed scores per image, each image's top class its own (row
    i peaks at class i)."""
    rows = np.full((images, SCORES_PER_IMAGE), 0.5 / (SCORES_PER_IMAGE - 1), np.float32)
    rows[np.arange(images), np.arange(images) % SCORES_PER_IMAGE] = 0.5
    return rows


def predict_response(model: str, images: int = 1) -> bytes:
    answer = _answer(model, images)
    response = tfs.PredictResponse(
        model_spec=tfs.ModelSpec(name=model, signature_name=SIGNATURE),
        outputs={k: _float_tensor(v) for k, v in answer.items()},
    )
    response.model_spec.version.value = VERSION
    return response.SerializeToString()


def metadata_response(model: str) -> tfs.GetModelMetadataResponse:
    dtype, dims = MODELS[model]
    signature = tfs.SignatureDef(method_name="tensorflow/serving/predict")
    signature.inputs["input_tensor"].CopyFrom(
        tfs.TensorInfo(name="input_tensor:0", dtype=dtype, tensor_shape=_shape(dims))
    )
    answer = _answer(model)
    for key, values in answer.items():
        out = (-1, *values.shape[1:]) if model == CLASSIFIER else values.shape
        signature.outputs[key].CopyFrom(
            tfs.TensorInfo(name=f"{key}:0", dtype=tfs.DT_FLOAT, tensor_shape=_shape(out))
        )
    signatures = tfs.SignatureDefMap()
    signatures.signature_def[SIGNATURE].CopyFrom(signature)
    response = tfs.GetModelMetadataResponse(model_spec=tfs.ModelSpec(name=model))
    response.model_spec.version.value = VERSION
    packed = response.metadata["signature_def"]
    # TF Serving's type name (our wire-compatible copy lives in another proto package).
    packed.type_url = f"type.googleapis.com/{SIGNATURE_DEF_MAP_TYPE}"
    packed.value = signatures.SerializeToString()
    return response


class Upstream:
    """The three RPCs; Predict's answer depends only on the model name, found in the bytes."""

    def __init__(self, delay: float = 0.0) -> None:
        self._answers = {name.encode(): predict_response(name) for name in MODELS}
        self._batches: dict[int, bytes] = {}  # the classifier's answer per batch size
        self._delay = delay
        self.requests = 0
        self.request_bytes = 0
        self.classifier_calls = 0
        self.classifier_images = 0

    async def predict(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.requests += 1
        self.request_bytes += len(request)
        if self._delay:
            await asyncio.sleep(self._delay)
        # ModelSpec.name sits in the first bytes wherever the gateway or a client put it;
        # parsing only the model spec keeps this cheap for multi-megabyte pixel requests.
        if CLASSIFIER.encode() in request[:64]:
            return self._classify(request)
        for name, answer in self._answers.items():
            if name in request[:64]:
                return answer
        await context.abort(grpc.StatusCode.NOT_FOUND, "Servable not found")
        raise AssertionError("unreachable")

    def _classify(self, request: bytes) -> bytes:
        tensors = tfs.PredictRequest.FromString(request).inputs.values()
        images = next(iter(tensors)).tensor_shape.dim[0].size if tensors else 1
        self.classifier_calls += 1
        self.classifier_images += images
        answer = self._batches.get(images)
        if answer is None:
            answer = self._batches[images] = predict_response(CLASSIFIER, images)
        return answer

    async def stats(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return (
            f"{self.requests} {self.request_bytes} {self.classifier_calls} {self.classifier_images}"
        ).encode()

    async def metadata(
        self, request: tfs.GetModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> tfs.GetModelMetadataResponse:
        if request.model_spec.name not in MODELS:
            await context.abort(grpc.StatusCode.NOT_FOUND, "Servable not found")
        return metadata_response(request.model_spec.name)

    async def status(
        self, request: tfs.GetModelStatusRequest, context: grpc.aio.ServicerContext
    ) -> tfs.GetModelStatusResponse:
        response = tfs.GetModelStatusResponse()
        if request.model_spec.name in MODELS:
            response.model_version_status.add(
                version=VERSION, state=tfs.ModelVersionStatus.AVAILABLE
            )
        return response

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def unary(behaviour: Any, request_type: Any = None) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                behaviour,
                request_deserializer=request_type.FromString if request_type else None,
                response_serializer=(lambda m: m.SerializeToString()) if request_type else None,
            )

        methods = {
            PREDICT: unary(self.predict),
            GET_MODEL_METADATA: unary(self.metadata, tfs.GetModelMetadataRequest),
            GET_MODEL_STATUS: unary(self.status, tfs.GetModelStatusRequest),
            STATS: unary(self.stats),
        }
        by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        for path, handler in methods.items():
            service, method = path.strip("/").split("/")
            by_service.setdefault(service, {})[method] = handler
        return [grpc.method_handlers_generic_handler(s, m) for s, m in by_service.items()]


def _stats(target: str) -> list[int]:
    with grpc.insecure_channel(target) as channel:
        answer: bytes = channel.unary_unary(STATS)(b"", timeout=10)
    return [int(n) for n in answer.split()]


def stats(target: str) -> tuple[int, int]:
    """(Predict requests, their bytes) the upstream at `target` has received so far."""
    requests, size, _, _ = _stats(target)
    return requests, size


def classified(target: str) -> tuple[int, int]:
    """(Predict calls, images in them) of the classifier so far."""
    _, _, calls, images = _stats(target)
    return calls, images


async def serve(port: int, host: str = "127.0.0.1", delay: float = 0.0) -> None:
    upstream = Upstream(delay)
    server = grpc.aio.server(
        handlers=upstream.handlers(),
        options=[("grpc.max_receive_message_length", -1), ("grpc.so_reuseport", 0)],
    )
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"bench upstream on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)
    print(f"requests {upstream.requests} bytes {upstream.request_bytes}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="per Predict, no CPU")
    args = parser.parse_args()
    asyncio.run(serve(args.port, delay=args.delay_ms / 1000))


if __name__ == "__main__":
    main()
