"""`python -m bench.cost`: does a caller's heavy work cost another caller (issue 42)?

A gateway with mTLS, a quota file and a model config in front of the canned upstream
(bench/upstream.py, each Predict answered after `--delay-ms`): model `encoded`, a detector,
and model `segmenter`, a Mask R-CNN layout that finds 100 whole-image instances in any image
(masks of noise: long outlines), the worst a caller can ask of the gateway's mask pasting.

1. price: the gateway process's CPU for one request of each candidate worst case (a
   4000x3000 PNG as RLE and as polygons, a 400x300 PNG as polygons; 100 instances each) with
   the default limits, and the 4000x3000 RLE one with them lifted (as before issue 42: every
   mask pasted and written); the costliest one answered is the heavy caller's request;
2. fairness: caller `steady` sends `--rate` Detects per second (open loop, the 640x480 JPEG),
   first alone, then while caller `heavy` sends the worst-case segmentation at its quota (2
   in flight, `--work-rate` work units per second; refusals retried after their RetryInfo
   delay) from a process of its own; meanwhile a third process asks `/ping` 10 times a
   second. Runs alternate `--runs` times.
Targets: steady p99 with the heavy caller within 1.5x of its p99 alone; `/ping` never over
250 ms; the gateway's peak RSS within its Kubernetes memory request (512 MiB).
-> the "cost" section of bench/results.md.

    python -m bench.cost [--seconds 20] [--runs 2] [--rate 20] [--work-rate 10] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from PIL import Image

from bench import load
from bench.fairness import STEADY, _credentials, open_loop
from bench.host import cpu_seconds, load_average, machine
from bench.processes import ROOT, free_port, stop_process
from bench.processes import upstream as canned_upstream
from bench.results import RESULTS, spread, verdict, write_section
from gateway.proto.segmentation.v1 import segmentation_pb2 as pb
from tests.support.certs import Certificates, make_certificates

HEAVY = "spiffe://bench.local/sa/heavy"
SEGMENT = "/segmentation.v1.SegmentationService/Segment"
TARGET, PING_TARGET_MS, RSS_BUDGET_MIB = 1.5, 250.0, 512.0
LIFTED = "[models.segmenter.limits]\nmax_mask_pixels = 2000000000\nmax_answer_bytes = 1073741824\n"


def worst_image(width: int, height: int) -> bytes:
    import io

    out = io.BytesIO()
    Image.new("RGB", (width, height), (120, 120, 120)).save(out, format="PNG")
    return out.getvalue()


@contextmanager
def gateway(upstream: str, certs: Certificates, directory: Path, limits: str) -> Iterator[Any]:
    config = directory / "models.toml"
    config.write_text(f'[models.segmenter]\ntask = "instance_segmentation"\n{limits}')
    quotas = directory / "quotas.toml"
    port, http = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
         f"--http-port={http}", f"--upstream={upstream}", "--model=encoded",
         "--metrics-port=0", f"--model-config={config}", f"--quotas={quotas}",
         f"--tls-cert-file={certs.server.cert}", f"--tls-key-file={certs.server.key}",
         f"--tls-client-ca-file={certs.ca}"],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"https://127.0.0.1:{http}/ping"
    tls = _tls(certs)
    try:
        started = time.monotonic()
        while not _pings(url, tls):
            if process.poll() is not None or time.monotonic() - started > 120:
                raise RuntimeError("gateway did not answer")
            time.sleep(0.1)
        yield process, f"127.0.0.1:{port}", url
    finally:
        stop_process(process)


def _tls(certs: Certificates) -> ssl.SSLContext:
    """The HTTP door's TLS as a caller sees it (the door asks for a client certificate)."""
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.check_hostname = False  # the bench's own CA; the address is a loopback IP
    pair = certs.clients["steady"]
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return context


def _pings(url: str, tls: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=tls) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _segment_body(image: bytes, mask_format: str = "polygon") -> bytes:
    request = pb.SegmentRequest(image=image, mask_format=mask_format)
    request.model.name = "segmenter"
    return request.SerializeToString()


def price(target: str, certs: Certificates, pid: int, body: bytes, count: int) -> tuple[float, str]:
    """The gateway's CPU seconds per request of `body`, `count` of them one after another, and
    what it answered ("answered, N instances" or the refusal's code). Sent as `steady`, a
    caller without a work quota: the price is the work's, not the heavy caller's bucket's."""
    options = [("grpc.max_receive_message_length", -1)]  # answers without limits are large
    with grpc.secure_channel(target, _credentials(certs, "steady"), options) as channel:
        call = channel.unary_unary(SEGMENT, response_deserializer=pb.SegmentationResult.FromString)
        call(_segment_body(worst_image(64, 48)), timeout=600)  # warm
        before = cpu_seconds([pid])
        outcome = ""
        for _ in range(count):
            try:
                result = call(body, timeout=900)
                outcome = f"{len(result.instances)} instances answered"
            except grpc.RpcError as error:
                outcome = f"refused, {error.code().name}"
        return (cpu_seconds([pid]) - before) / count, outcome


async def _heavy_loop(target: str, certs: Certificates, body: bytes, seconds: float) -> list[int]:
    """Two worst-case segmentations in flight for `seconds` (the caller's concurrency),
    refusals retried after their delay; [answers, refusals, other errors]."""
    counts = [0, 0, 0]
    stop = time.monotonic() + seconds
    async with grpc.aio.secure_channel(target, _credentials(certs, "heavy")) as channel:
        call = channel.unary_unary(SEGMENT)

        async def worker() -> None:
            while time.monotonic() < stop:
                try:
                    await call(body, timeout=60)
                    counts[0] += 1
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        counts[2] += 1
                        await asyncio.sleep(0.1)
                        continue
                    counts[1] += 1
                    status = rpc_status.from_call(error)
                    info = error_details_pb2.RetryInfo()
                    delay = 0.1
                    if status is not None and status.details and status.details[0].Unpack(info):
                        delay = info.retry_delay.ToTimedelta().total_seconds()
                    await asyncio.sleep(min(delay, max(0.0, stop - time.monotonic())))

        await asyncio.gather(worker(), worker())
    return counts


def _heavy(target: str, certs: Certificates, body: bytes, seconds: float, out: Any) -> None:
    out.put(asyncio.run(_heavy_loop(target, certs, body, seconds)))


def _pinger(url: str, certs: Certificates, seconds: float, out: Any) -> None:
    tls = _tls(certs)
    waits: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        started = time.perf_counter()
        _pings(url, tls)
        waits.append((time.perf_counter() - started) * 1e3)
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))
    out.put(waits)


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="per run")
    parser.add_argument("--runs", type=int, default=2, help="pairs of runs (alone, heavy)")
    parser.add_argument("--rate", type=float, default=20.0, help="steady caller, per second")
    parser.add_argument("--work-rate", type=float, default=10.0, help="heavy caller's quota")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the upstream's time")
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.runs, args.rate = 3.0, 1, 10.0
    big, small = worst_image(4000, 3000), worst_image(400, 300)
    candidates = {"400x300 PNG, polygons": _segment_body(small)}
    if not args.quick:
        candidates["4000x3000 PNG, RLE"] = _segment_body(big, "rle")
        candidates["4000x3000 PNG, polygons"] = _segment_body(big)
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    alone: list[float] = []
    heavy: list[float] = []
    ratios: list[float] = []
    pings: list[float] = []
    heavy_counts = [0, 0, 0]
    steady_errors = 0
    prices: dict[str, tuple[float, str]] = {}
    lifted: tuple[float, str] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        certs = make_certificates(directory, clients={"steady": STEADY, "heavy": HEAVY})
        (directory / "quotas.toml").write_text(
            f'[callers."uri:{HEAVY}"]\nconcurrency = 2\nwork_rate = {args.work_rate:g}\n'
        )
        with canned_upstream(args.delay_ms) as up:
            if not args.quick:  # before issue 42: every mask pasted and written (one request)
                with gateway(up, certs, directory, LIFTED) as (process, target, _):
                    lifted = price(target, certs, process.pid, _segment_body(big, "rle"), 1)
            with gateway(up, certs, directory, "") as (process, target, url):
                for what, body in candidates.items():
                    prices[what] = price(target, certs, process.pid, body, 1 if args.quick else 2)
                answered = {w: p for w, p in prices.items() if "answered" in p[1]}
                worst = max(answered, key=lambda w: answered[w][0])
                time.sleep(5)  # the gateway settled
                context = multiprocessing.get_context("spawn")
                for _ in range(args.runs):
                    for with_heavy in (False, True):
                        results = context.Queue()
                        others = []
                        if with_heavy:
                            others.append(context.Process(
                                target=_heavy, args=(target, certs, candidates[worst],
                                                     args.seconds + 1, results),
                            ))  # fmt: skip
                        others.append(
                            context.Process(
                                target=_pinger, args=(url, certs, args.seconds, results)
                            )
                        )
                        for other in others:
                            other.start()
                        steady = asyncio.run(
                            open_loop(target, certs, "steady", args.rate, args.seconds)
                        )
                        latencies, exhausted, _, errors = steady
                        steady_errors += exhausted + errors
                        for _other in others:
                            got = results.get(timeout=args.seconds + 300)
                            if got and isinstance(got[0], int):
                                heavy_counts = [
                                    a + b for a, b in zip(heavy_counts, got, strict=True)
                                ]
                            else:
                                pings.extend(got)
                        for other in others:
                            other.join()
                        p99 = load.Latencies(latencies).p(99)
                        if with_heavy:
                            heavy.append(p99)
                            ratios.append(p99 / alone[-1])
                        else:
                            alone.append(p99)
                rss = _peak_rss_mib(process.pid)
    worst_ping = max(pings, default=0.0)
    command = (
        f"python -m bench.cost --seconds {args.seconds:g} --runs {args.runs} --rate {args.rate:g}"
        f" --work-rate {args.work_rate:g} --delay-ms {args.delay_ms:g}"
        + (" --quick" if args.quick else "")
    )
    price_rows = [
        f"| gateway CPU per request: {what}, default limits | {cpu:.2f} s ({outcome}) |"
        for what, (cpu, outcome) in prices.items()
    ]
    if lifted is not None:
        price_rows.insert(0, f"| gateway CPU per request: 4000x3000 PNG, RLE, limits lifted (as "
                             f"before issue 42) | {lifted[0]:.2f} s ({lifted[1]}) |")  # fmt: skip
    text = "\n".join(
        [
            "## Work priced before it runs (`python -m bench.cost`)",
            "",
            f"`{command}` on {began}: {machine()}. Load average before {load_before}, after "
            f"{load_average()} (shared machine: upstream, gateway and the three callers on the "
            "same cores).",
            "",
            f"A gateway with mTLS, a quota file and a model config in front of the canned "
            f"upstream answering each Predict after {args.delay_ms:g} ms. The worst-case "
            "requests: `:segment` to a Mask R-CNN-layout model that returns 100 whole-image "
            "instances (masks of noise), on a plain PNG (4000x3000: "
            f"{len(big) // 1024} KB). Caller `steady` sends {args.rate:g} Detects/s (640x480 "
            f"JPEG, open loop) for {args.seconds:g} s, alone and then while caller `heavy` "
            f"(quota: 2 in flight, {args.work_rate:g} work units/s) sends the costliest "
            f"request answered ({worst}) as fast as its quota lets it; `/ping` asked 10 times "
            f"a second throughout; {args.runs} pairs of runs.",
            "",
            "| | value |",
            "|---|---|",
            *price_rows,
            f"| steady p99 alone | {spread(alone)} ms |",
            f"| steady p99 beside the heavy caller | {spread(heavy)} ms |",
            f"| beside / alone | {spread(ratios)}x (target <= {TARGET}x: "
            f"{verdict(ratios, lambda r: r <= TARGET)}) |",
            f"| steady errors (any) | {steady_errors} |",
            f"| heavy caller: answered, refused (RESOURCE_EXHAUSTED), other errors | "
            f"{heavy_counts[0]}, {heavy_counts[1]}, {heavy_counts[2]} |",
            f"| `/ping` slowest of {len(pings)} | {worst_ping:.1f} ms (target <= "
            f"{PING_TARGET_MS:.0f} ms: {verdict([worst_ping], lambda w: w <= PING_TARGET_MS)}) |",
            f"| gateway peak RSS | {rss:.0f} MiB (budget {RSS_BUDGET_MIB:.0f} MiB, its "
            f"Kubernetes memory request: {verdict([rss], lambda r: r <= RSS_BUDGET_MIB)}) |",
        ]
    )
    write_section(args.out, "cost", text)
    print(text)


if __name__ == "__main__":
    main()
