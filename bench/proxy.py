"""The floor of any Python gRPC gateway: a grpc.aio server that forwards Predict bytes as they
are to the upstream and its answer back, with no parsing, decoding, logging or metrics.

Its added latency over calling the upstream directly is what one extra grpc.aio hop costs
in Python on this machine, before the gateway does any work of its own.

`--send FILE`: forward the bytes of FILE in place of each request received (still unread).
For pixel mode that makes the floor like for like: the proxy receives what the gateway
receives (the caller's 54 KB JPEG request) and sends what the gateway sends (the 0.92 MB
pixel request), so the only difference left to the gateway is its own work.

    python -m bench.proxy --port 8600 --upstream 127.0.0.1:8500 [--send request.bin]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import grpc

from bench.load import CHANNEL_OPTIONS
from gateway.upstream.client import PREDICT


async def serve(port: int, upstream: str, send: bytes | None = None) -> None:
    async with grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS) as channel:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--send", type=Path, help="forward these bytes instead of the request")
    args = parser.parse_args()
    send = args.send.read_bytes() if args.send else None
    asyncio.run(serve(args.port, args.upstream, send))


if __name__ == "__main__":
    main()
