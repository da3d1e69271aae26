"""The floor of any Python gRPC gateway: a grpc.aio server that forwards Predict bytes as they
are to the upstream and its answer back, with no parsing, decoding, logging or metrics.

Its added latency over calling the upstream directly is what one extra grpc.aio hop costs
in Python on this machine, before the gateway does any work of its own.

    python -m bench.proxy --port 8600 --upstream 127.0.0.1:8500
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc

from bench.load import CHANNEL_OPTIONS
from gateway.upstream.client import PREDICT


async def serve(port: int, upstream: str) -> None:
    async with grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS) as channel:
        predict = channel.unary_unary(PREDICT)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await predict(request, timeout=60)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
