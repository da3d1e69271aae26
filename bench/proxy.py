"""The floor of any Python gRPC gateway: a grpc.aio server that forwards Predict bytes as they
are to the upstream and its answer back, with no parsing, decoding, logging or metrics.

Its added latency over calling the upstream directly is what one extra grpc.aio hop costs
in Python on this machine, before the gateway does any work of its own.

`--send FILE`: forward the bytes of FILE in place of each request received (still unread).
For pixel mode that makes the floor like for like: the proxy receives what the gateway
receives (the caller's 54 KB JPEG request) and sends what the gateway sends (the 0.92 MB
pixel request), so the only difference left to the gateway is its own work.

`--typed` (with `--send`): serve detection.v1's Detect instead, as a typed service: parse the
DetectRequest, call the upstream with FILE and parse its PredictResponse, answer a fixed
DetectionResult of five detections. The floor of a typed Python gRPC gateway: gRPC's work
for such a service, without any of the gateway's own work (decode, mapping, logs, metrics).

`--http` (with `--send`): the same floor for the HTTP door: an aiohttp server (the framework
of the gateway's HTTP door) that reads each POST's body unparsed, forwards FILE over grpc.aio
and answers a fixed JSON detection result of the gateway's size, with no decoding, parsing,
logging or metrics.

    python -m bench.proxy --port 8600 --upstream 127.0.0.1:8500 [--send request.bin] [--typed]
    python -m bench.proxy --port 8600 --upstream 127.0.0.1:8500 --send request.bin --http
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import grpc
from aiohttp import web
from google.protobuf import json_format

from bench.load import CHANNEL_OPTIONS
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.detection.binding import BINDING as DETECT
from gateway.upstream.client import PREDICT


async def serve(port: int, upstream: str, send: bytes | None = None, typed: bool = False) -> None:
    async with grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS) as channel:
        if typed:
            if send is None:
                raise SystemExit("--typed needs --send (the PredictRequest to forward)")
            handler = _typed_handler(channel, send)
        else:
            predict = channel.unary_unary(PREDICT)

            async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                return await predict(request if send is None else send, timeout=60)

            service, method = PREDICT.strip("/").split("/")
            handler = grpc.method_handlers_generic_handler(
                service, {method: grpc.unary_unary_rpc_method_handler(forward)}
            )
        server = grpc.aio.server(handlers=[handler], options=CHANNEL_OPTIONS)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop(1)


async def serve_http(port: int, upstream: str, send: bytes) -> None:
    """The HTTP door's floor: every POST forwards `send` upstream and answers FIXED_JSON."""
    async with grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS) as channel:
        predict = channel.unary_unary(PREDICT)

        async def forward(request: web.Request) -> web.Response:
            await request.read()
            await predict(send, timeout=60)
            return web.Response(body=FIXED_JSON, content_type="application/json")

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("POST", "/{path:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()


def _fixed_result() -> pb.DetectionResult:
    """Five detections, as the gateway answers for the bench upstream's outputs."""
    return pb.DetectionResult(
        detections=[
            pb.Detection(
                class_id=i,
                label=f"class_{i}",
                score=0.9 - i / 10,
                box=pb.BoundingBox(x_min=10 * i, y_min=20, x_max=10 * i + 50, y_max=90),
                normalized_box=pb.NormalizedBox(x_min=0.1, y_min=0.2, x_max=0.3, y_max=0.4),
            )
            for i in range(1, 6)
        ],
        image_width=640,
        image_height=480,
        model=model_pb2.ServedModel(name="encoded", version=1),
        request_id="0123456789abcdef0123456789abcdef",
    )


FIXED_JSON = json_format.MessageToJson(
    _fixed_result(), preserving_proto_field_name=True, indent=None
).encode()


def _typed_handler(channel: grpc.aio.Channel, send: bytes) -> grpc.GenericRpcHandler:
    predict = channel.unary_unary(
        PREDICT, request_serializer=None, response_deserializer=tfs.PredictResponse.FromString
    )
    result = _fixed_result()

    async def detect(request: pb.DetectRequest, context: grpc.aio.ServicerContext) -> object:
        await predict(send, timeout=60)
        return result

    return grpc.method_handlers_generic_handler(
        DETECT.service_name,
        {
            "Detect": grpc.unary_unary_rpc_method_handler(
                detect,
                request_deserializer=pb.DetectRequest.FromString,
                response_serializer=pb.DetectionResult.SerializeToString,
            )
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--send", type=Path, help="forward these bytes instead of the request")
    parser.add_argument("--typed", action="store_true", help="serve detection.v1 Detect, typed")
    parser.add_argument("--http", action="store_true", help="serve HTTP POST (needs --send)")
    args = parser.parse_args()
    send = args.send.read_bytes() if args.send else None
    if args.http:
        if send is None:
            raise SystemExit("--http needs --send (the PredictRequest to forward)")
        asyncio.run(serve_http(args.port, args.upstream, send))
    else:
        asyncio.run(serve(args.port, args.upstream, send, args.typed))


if __name__ == "__main__":
    main()
