"""A Python client for the gateway's gRPC API (and its HTTP door), and its command line
(gateway.client.cli, `python -m gateway.client`).

    with GatewayClient("localhost:50051") as client:
        result = client.detect(Path("street.jpg").read_bytes(), min_score=0.4)
        for d in result.detections:
            print(d.label, d.score, d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max)
        result = client.classify(Path("cat.jpg").read_bytes(), top_k=3)
        print([(c.label, c.score) for c in result.classes])
        result = client.run_pipeline(Path("street.jpg").read_bytes(), "detect_then_classify")
        for instance, d in zip(result.instances, result.detections.detections):
            print(d.label, instance.steps["colour"].classes.classes[0].label)

Every task the bindings hold is a method named by its verb (detect, classify, embed,
keypoints, segment, ...); a pipeline of the gateway's model config runs by `run_pipeline`
(`run_pipeline_stream`; over HTTP: HttpClient.run_pipeline). One task: `TaskClient(target,
binding)` with a binding of gateway.api.bindings; asyncio: `AioTaskStub(open_aio_channel(
target), binding)`.
"""

from gateway.api.arguments import add_tls_arguments, tls_from_args
from gateway.api.bindings import model_spec
from gateway.api.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    AioTaskStub,
    open_aio_channel,
    open_channel,
)
from gateway.client.cli import main
from gateway.client.drawing import DRAW_COLOUR, draw, draw_path, draw_pipeline
from gateway.client.http_client import HttpCallError, HttpClient
from gateway.client.messages import result_dict, task_request
from gateway.client.pipelines import pipeline_request
from gateway.client.stubs import ClassificationClient, DetectionClient, GatewayClient, TaskClient
from gateway.tls import TLS

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DRAW_COLOUR",
    "TLS",
    "AioTaskStub",
    "ClassificationClient",
    "DetectionClient",
    "GatewayClient",
    "HttpCallError",
    "HttpClient",
    "TaskClient",
    "add_tls_arguments",
    "draw",
    "draw_path",
    "draw_pipeline",
    "main",
    "model_spec",
    "open_aio_channel",
    "open_channel",
    "pipeline_request",
    "result_dict",
    "task_request",
    "tls_from_args",
]
