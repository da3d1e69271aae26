"""`python -m bench.fairness`: does one caller's burst cost another caller (issue 35.1)?

A gateway with mTLS and a quota file in front of the canned upstream answering each Predict
after `--delay-ms` (a model's time, without its CPU). Two callers with client certificates:
`steady` sends at its normal rate (open loop, `--rate` per second, within its quota), first
alone, then while `burster` sends at 10x its quota (a process of its own, open loop). Runs
alternate (alone, with the burst) `--runs` times. Target: the steady caller's p99 with the
burst within 1.5x of its p99 alone, and no RESOURCE_EXHAUSTED for it; the burster gets
RESOURCE_EXHAUSTED with a google.rpc.RetryInfo delay.
-> the "fairness" section of bench/results.md.

    python -m bench.fairness [--seconds 20] [--runs 3] [--rate 20] [--burst-quota 10]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from bench import load
from bench.host import load_average, machine
from bench.processes import ROOT, free_port, stop_process
from bench.processes import upstream as canned_upstream
from bench.results import RESULTS, spread, verdict, write_section
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from tests.support.certs import Certificates, make_certificates

PHOTO = ROOT / "bench" / "images" / "photo_640x480.jpg"
STEADY = "spiffe://bench.local/sa/steady"
BURSTER = "spiffe://bench.local/sa/burster"
TARGET = 1.5


@contextmanager
def gateway(upstream: str, certs: Certificates, quotas: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
         f"--upstream={upstream}", "--model=encoded", "--metrics-port=0", "--http-port=0",
         f"--quotas={quotas}", f"--tls-cert-file={certs.server.cert}",
         f"--tls-key-file={certs.server.key}", f"--tls-client-ca-file={certs.ca}"],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while not _answers(target, certs):
            if process.poll() is not None or time.monotonic() - started > 60:
                raise RuntimeError("gateway did not answer")
            time.sleep(0.05)
        yield target
    finally:
        stop_process(process)


def _credentials(certs: Certificates, client: str) -> grpc.ChannelCredentials:
    pair = certs.clients[client]
    return grpc.ssl_channel_credentials(
        certs.ca.read_bytes(), pair.key.read_bytes(), pair.cert.read_bytes()
    )


def _answers(target: str, certs: Certificates) -> bool:
    with grpc.secure_channel(target, _credentials(certs, "steady")) as channel:
        try:
            channel.unary_unary(load.DETECT)(_body(), timeout=2)
        except grpc.RpcError:
            return False
    return True


def _body() -> bytes:
    image = PHOTO.read_bytes()
    return pb.DetectRequest(
        image=image, model=model_pb2.ModelSpec(name="encoded")
    ).SerializeToString()


async def open_loop(
    target: str, certs: Certificates, client: str, rate: float, seconds: float, ready: Any = None
) -> tuple[list[float], int, list[float], int]:
    """Calls at `rate` per second for `seconds` whatever the answers take (setting `ready`,
    an Event, once connected); (latencies in ms of the calls that succeeded,
    RESOURCE_EXHAUSTED count, their retry delays in s, other errors)."""
    body = _body()
    latencies: list[float] = []
    delays: list[float] = []
    exhausted = others = 0
    async with grpc.aio.secure_channel(target, _credentials(certs, client)) as channel:
        call = channel.unary_unary(load.DETECT)
        await call(body, timeout=30)  # connected and warm
        if ready is not None:
            ready.set()

        async def one() -> None:
            nonlocal exhausted, others
            started = time.perf_counter()
            try:
                await call(body, timeout=30)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    others += 1
                    return
                exhausted += 1
                status = rpc_status.from_call(error)
                info = error_details_pb2.RetryInfo()
                if status is not None and status.details and status.details[0].Unpack(info):
                    delays.append(info.retry_delay.ToTimedelta().total_seconds())
                return
            latencies.append((time.perf_counter() - started) * 1e3)

        calls = []
        began = time.perf_counter()
        for n in range(int(rate * seconds)):
            wait = began + n / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            calls.append(asyncio.ensure_future(one()))
        await asyncio.gather(*calls)
    return latencies, exhausted, delays, others


def _burster(
    target: str, certs: Certificates, rate: float, seconds: float, ready: Any, out: Any
) -> None:
    out.put(asyncio.run(open_loop(target, certs, "burster", rate, seconds, ready)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="per run")
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs (alone, burst)")
    parser.add_argument("--rate", type=float, default=20.0, help="steady caller, per second")
    parser.add_argument("--burst-quota", type=float, default=10.0, help="burster's rate quota")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the upstream's time")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    steady_quota = 2.5 * args.rate
    alone: list[float] = []
    burst: list[float] = []
    ratios: list[float] = []
    burster_runs: list[tuple[list[float], int, list[float], int]] = []
    steady_exhausted = steady_errors = 0
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certificates(Path(tmp), clients={"steady": STEADY, "burster": BURSTER})
        quotas = Path(tmp) / "quotas.toml"
        quotas.write_text(
            f'[callers."uri:{STEADY}"]\nrate = {steady_quota:g}\n'
            f'[callers."uri:{BURSTER}"]\nrate = {args.burst_quota:g}\n'
        )
        with canned_upstream(args.delay_ms) as up, gateway(up, certs, quotas) as target:
            context = multiprocessing.get_context("spawn")
            for _ in range(args.runs):
                for with_burst in (False, True):
                    results = context.Queue() if with_burst else None
                    burster = None
                    if with_burst:
                        # Started and connected before the steady caller's run, and sending
                        # until after it ends: the run sees the burst only.
                        ready = context.Event()
                        burster = context.Process(
                            target=_burster,
                            args=(target, certs, 10 * args.burst_quota, args.seconds + 2,
                                  ready, results),
                        )  # fmt: skip
                        burster.start()
                        ready.wait(120)
                        time.sleep(0.5)  # its first burst spent, the steady state of refusals
                    steady = asyncio.run(
                        open_loop(target, certs, "steady", args.rate, args.seconds)
                    )
                    latencies, exhausted, _, errors = steady
                    steady_exhausted += exhausted
                    steady_errors += errors
                    p99 = load.Latencies(latencies).p(99)
                    if burster is not None and results is not None:
                        burster_runs.append(results.get(timeout=args.seconds + 120))
                        burster.join()
                        burst.append(p99)
                        ratios.append(p99 / alone[-1])
                    else:
                        alone.append(p99)
    sent = int(10 * args.burst_quota * (args.seconds + 2))
    refused = [r[1] for r in burster_runs]
    delays = [d for r in burster_runs for d in r[2]]
    with_info = sum(len(r[2]) for r in burster_runs)
    command = (
        f"python -m bench.fairness --seconds {args.seconds:g} --runs {args.runs} "
        f"--rate {args.rate:g} --burst-quota {args.burst_quota:g} --delay-ms {args.delay_ms:g}"
    )
    ok = steady_exhausted == 0 and steady_errors == 0
    text = "\n".join(
        [
            "## Fair share per caller (`python -m bench.fairness`)",
            "",
            f"`{command}` on {began}: {machine()}. Load average before {load_before}, after "
            f"{load_average()} (shared machine: upstream, gateway and both callers on the same "
            "cores).",
            "",
            f"A gateway with mTLS and a quota file in front of the canned upstream answering "
            f"each Predict after {args.delay_ms:g} ms (model `encoded`, the 640x480 JPEG). "
            f"Caller `steady` (quota {steady_quota:g}/s) sends {args.rate:g} requests/s, open "
            f"loop, {args.seconds:g} s per run, alone and then while caller `burster` (quota "
            f"{args.burst_quota:g}/s) sends {10 * args.burst_quota:g}/s (10x its quota) from "
            f"a process of its own; {args.runs} pairs of runs, alternating.",
            "",
            "| | value |",
            "|---|---|",
            f"| steady p99 alone | {spread(alone)} ms |",
            f"| steady p99 with the burst | {spread(burst)} ms |",
            f"| with / alone | {spread(ratios)}x (target <= {TARGET}x: "
            f"{verdict(ratios, lambda r: r <= TARGET)}) |",
            f"| steady RESOURCE_EXHAUSTED, other errors | {steady_exhausted}, {steady_errors} "
            f"({'met' if ok else '**not met**'}: none wanted) |",
            f"| burster refused (RESOURCE_EXHAUSTED) per run of {sent} | "
            f"{spread([float(r) for r in refused], '{:.0f}')} |",
            f"| refusals with a RetryInfo delay | {with_info} of {sum(refused)}; delays "
            f"{min(delays, default=0):.3f} to {max(delays, default=0):.3f} s |",
        ]
    )
    write_section(args.out, "fairness", text)
    print(text)


if __name__ == "__main__":
    main()
