"""HTTP load for bench.http: closed-loop aiohttp clients in processes of their own, as
bench.load's Python generator runs grpc.aio clients."""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import aiohttp  # imported here, so the client processes have it before the clock starts

from bench import load


def _http_client(
    url: str, content_type: str, body: bytes, tasks: int, begin: float, end: float
) -> tuple[list[float], int]:
    """One client process: `tasks` callers, one keep-alive connection each, until `end`."""

    async def run() -> tuple[list[float], int]:
        latencies: list[float] = []
        errors = 0
        connector = aiohttp.TCPConnector(limit=tasks)
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with aiohttp.ClientSession(connector=connector) as session:

            async def caller() -> None:
                nonlocal errors
                while (now := time.time()) < end:
                    started = time.perf_counter()
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        ok = response.status == 200
                    if now >= begin:
                        if ok:
                            latencies.append((time.perf_counter() - started) * 1e3)
                        else:
                            errors += 1

            await asyncio.gather(*(caller() for _ in range(tasks)))
        return latencies, errors

    return asyncio.run(run())


def http_closed_loop(
    url: str,
    content_type: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    warmup: float = 1.0,
    processes: int = 2,
) -> load.Latencies:
    """As bench.load's Python generator, with aiohttp's client instead of grpc.aio."""
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        pool.map(time.sleep, [0] * processes)
        begin = time.time() + warmup
        end = begin + seconds
        results = [
            pool.apply_async(_http_client, (url, content_type, body, share, begin, end))
            for share in shares
        ]
        outputs = [r.get(timeout=seconds + 120) for r in results]
    latencies = [ms for out, _ in outputs for ms in out]
    return load.Latencies(latencies, sum(e for _, e in outputs), len(latencies) / seconds)
