"""The gateway's own Python per request, without gRPC: servicer -> pipeline -> result bytes.

Runs detection.v1 Detect's servicer in this process, one request after another, with TF
Serving replaced by a coroutine that answers bench/upstream.py's fixed response (parsed each
time, as gRPC would). What it measures is what the CPU-per-request comparison (section 2 of
`python -m bench`) attributes to the gateway beyond a typed do-nothing proxy, without the
noise of a loaded machine: use it to compare two versions of the code in one sitting
(it prints; it writes no results). Log lines go to /dev/null at INFO, as in the bench.

`--cold MIB` copies a buffer of MIB mebibytes between requests and times each request alone:
the gateway's Python then runs with its code and data out of the CPU caches, as it does under
load, where gRPC's C code, the kernel and the other processes on the cores run between two
requests. Warm, the request costs about a third of what it costs there; with 24-32 MiB
copied (enough to leave this machine's shared cache) the figure comes near what the
CPU-per-request comparison attributes to the gateway. A change's saving here came within a few
µs of its saving there for savings of 10-20 µs; one of 8-13 µs here did not show there, within
the spread of identical processes (bench/notes.md). Use it to rank changes; confirm
under load.

    python -m bench.ownwork [--requests 20000] [--cold 24]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from bench import photos, upstream
from gateway import logs, memory, policy
from gateway.app import built_in_tasks, load_models
from gateway.core.pipeline import Pipeline
from gateway.flags import parse_settings
from gateway.frontends.grpc.servicers import Drain, TaskServicer
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.builtin import BUILT_IN
from gateway.upstream.client import TFServingClient


class _Context:
    """What the servicer asks of grpc.aio's context."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("user-agent", "grpc-c/1"),)

    def auth_context(self) -> dict[str, list[bytes]]:
        # A plaintext call's: no client certificate (the caller is "anonymous").
        return {"transport_security_type": [b"insecure"]}

    def set_trailing_metadata(self, metadata: object) -> None:
        self.trailing = metadata

    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, code: object, message: str) -> None:
        raise RuntimeError(f"{code}: {message}")


async def measure(requests: int, batches: int = 5, cold_mib: float = 0.0) -> float:
    """µs per request: best of `batches` batches; with `cold_mib`, the mean of the fastest
    90 % of requests each timed alone after copying `cold_mib` MiB."""
    memory.tune_malloc()
    settings = parse_settings(["--upstream=127.0.0.1:1", "--model=encoded", "--metrics-port=0"])
    logs.setup("INFO")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    client = TFServingClient(settings)
    answer = upstream.predict_response("encoded")
    metadata = upstream.metadata_response("encoded")

    async def predict(request: bytes, **_: Any) -> tfs.PredictResponse:
        return tfs.PredictResponse.FromString(answer)

    async def describe(request: object, **_: Any) -> tfs.GetModelMetadataResponse:
        return metadata

    client._predict = predict
    client._metadata = describe
    with open(os.devnull, "w", buffering=1) as sink, ThreadPoolExecutor(2) as executor:
        handler.setStream(sink)
        tasks = built_in_tasks()
        models = load_models(settings, tasks)
        pipeline = Pipeline(
            settings, client, models, executor, tasks, policy.build(settings, models)
        )
        servicer = TaskServicer(BUILT_IN.for_verb("detect"), pipeline, Drain())
        body = pb.DetectRequest(
            image=photos.load()["JPEG 640x480"], model=model_pb2.ModelSpec(name="encoded")
        ).SerializeToString()
        context: Any = _Context()

        async def one() -> bytes:
            request = pb.DetectRequest.FromString(body)
            return (await servicer.unary(request, context)).SerializeToString()

        for _ in range(500):
            await one()
        figure = await (
            _cold(one, requests, cold_mib) if cold_mib else _warm(one, requests, batches)
        )
        handler.setStream(sys.stderr)
    await client.close()
    return figure


async def _warm(one: Any, requests: int, batches: int) -> float:
    best = float("inf")
    per_batch = max(1, requests // batches)
    for _ in range(batches):
        started = time.perf_counter()
        for _ in range(per_batch):
            await one()
        best = min(best, (time.perf_counter() - started) / per_batch)
    return best * 1e6


async def _cold(one: Any, requests: int, cold_mib: float) -> float:
    source = np.ones(int(cold_mib * 2**20) // 8)
    target = np.empty_like(source)
    times = []
    for _ in range(requests):
        np.copyto(target, source)  # evicts the gateway's code and data from the caches
        started = time.perf_counter()
        await one()
        times.append(time.perf_counter() - started)
    times.sort()
    kept = times[: max(1, len(times) * 9 // 10)]
    return sum(kept) / len(kept) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument(
        "--cold",
        type=float,
        default=0.0,
        metavar="MIB",
        help="copy MIB mebibytes between requests (caches disturbed, as under load)",
    )
    args = parser.parse_args(argv)
    micros = asyncio.run(measure(args.requests, cold_mib=args.cold))
    if args.cold:
        print(
            f"gateway's own work per string-mode Detect, caches disturbed ({args.cold:g} MiB "
            f"copied between requests; fastest 90 %): {micros:.1f} µs"
        )
    else:
        print(f"gateway's own work per string-mode Detect (best of 5 batches): {micros:.1f} µs")


if __name__ == "__main__":
    main()
