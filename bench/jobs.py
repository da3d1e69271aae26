"""`python -m bench.jobs`: do batch jobs over the API (local executor) slow online calls?

Online p50 of unary Detect (closed loop, bench/load.py) against the gateway with no job, then
while 3 batch jobs run at once in the same gateway (CreateBatchJob over directories of the
640x480 JPEG), then with no job again; the fast canned upstream (bench/upstream.py), so the
gateway's own CPU is what is shared. Also the jobs' images/s with the online load on and
after it stopped. Target: online p50 with jobs within 1.5x of its value without.
-> the "Batch jobs over the API" section of bench/results.md.

    python -m bench.jobs [--images 1500] [--concurrency 4] [--seconds 8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
from google.longrunning import operations_pb2 as lro
from google.longrunning import operations_pb2_grpc as lro_grpc

from bench import load, results
from bench.host import load_average, machine
from bench.processes import ROOT, free_port, is_serving, stop_process
from bench.processes import upstream as canned_upstream
from bench.results import RESULTS
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import batch_pb2 as bpb
from gateway.proto.vision.v1 import batch_pb2_grpc as bpb_grpc
from gateway.proto.vision.v1 import model_pb2

TITLE = "## Batch jobs over the API (`python -m bench.jobs`)"
PHOTO = ROOT / "bench" / "images" / "photo_640x480.jpg"
JOBS = 3


@contextmanager
def gateway(upstream: str, store: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
         f"--upstream={upstream}", "--model=pixels", "--metrics-port=0",
         f"--job-store={store}", f"--batch-max-running={JOBS}",
         f"--batch-allowed-input-uris={store.parent}", "--batch-allow-anonymous=true"],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while not is_serving(target):
            if process.poll() is not None or time.monotonic() - started > 60:
                raise RuntimeError("gateway did not become SERVING")
            time.sleep(0.01)
        yield target
    finally:
        stop_process(process)


def processed(ops: lro_grpc.OperationsStub, names: list[str]) -> tuple[int, bool]:
    total, done = 0, True
    for name in names:
        op = ops.GetOperation(lro.GetOperationRequest(name=name), timeout=30)
        meta = bpb.BatchJobMetadata()
        op.metadata.Unpack(meta)
        total += meta.processed
        done = done and op.done
    return total, done


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs", description=__doc__)
    parser.add_argument("--images", type=int, default=1500, help="per job")
    parser.add_argument("--concurrency", type=int, default=4, help="online callers")
    parser.add_argument("--seconds", type=float, default=8.0, help="per online load run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    jpeg = PHOTO.read_bytes()
    body = pb.DetectRequest(
        image=jpeg, model=model_pb2.ModelSpec(name="pixels")
    ).SerializeToString()
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        sources = []
        for j in range(JOBS):
            source = Path(tmp) / f"images-{j}"
            source.mkdir()
            for n in range(args.images):
                (source / f"{n:06d}.jpg").write_bytes(jpeg)
            sources.append(source)
        with canned_upstream() as up, gateway(up, Path(tmp) / "store") as target:
            channel = grpc.insecure_channel(target)
            batch, ops = bpb_grpc.BatchServiceStub(channel), lro_grpc.OperationsStub(channel)

            def online() -> load.Latencies:
                return load.closed_loop(target, load.DETECT, body, args.concurrency, args.seconds)

            before = online()
            names = [
                batch.CreateBatchJob(
                    bpb.CreateBatchJobRequest(
                        input_uri=str(s), model=model_pb2.ModelSpec(name="pixels")
                    ),
                    timeout=60,
                ).name
                for s in sources
            ]
            start_count, _ = processed(ops, names)
            load_started = time.monotonic()
            during = online()
            load_seconds = time.monotonic() - load_started
            after_load, _ = processed(ops, names)
            alone_started = time.monotonic()
            while True:
                count, done = processed(ops, names)
                if done:
                    break
                time.sleep(0.2)
            alone_seconds = time.monotonic() - alone_started
            after = online()
            channel.close()
    baseline = (before.p(50) + after.p(50)) / 2
    ratio = during.p(50) / baseline
    during_rate = (after_load - start_count) / load_seconds
    alone_rate = (count - after_load) / alone_seconds if alone_seconds > 0 else float("nan")
    command = (
        f"python -m bench.jobs --images {args.images} --concurrency {args.concurrency} "
        f"--seconds {args.seconds:g}"
    )
    lines = [
        f"`{command}` on {began}: {machine()}. Load average before {load_before}, after "
        f"{load_average()} (shared machine: upstream, gateway and load generator on the same "
        "cores).",
        "",
        f"Online: unary Detect of the 640x480 JPEG, closed loop at concurrency "
        f"{args.concurrency} ({load.generator()}), {args.seconds:g} s per run, against the "
        f"canned upstream (model `pixels`). Jobs: {JOBS} `CreateBatchJob` over directories of "
        f"{args.images} copies each, local executor with its defaults (batch-concurrency 4, "
        f"batch-yield-threshold 2, batch-max-running {JOBS}).",
        "",
        "| run | online p50 ms | online p99 ms | online req/s | errors | jobs' images/s |",
        "|---|---|---|---|---|---|",
        f"| no job (before) | {before.p(50):.1f} | {before.p(99):.1f} | {before.rate:.0f} | "
        f"{before.errors} | |",
        f"| {JOBS} jobs running | {during.p(50):.1f} | {during.p(99):.1f} | {during.rate:.0f} | "
        f"{during.errors} | {during_rate:.0f} |",
        f"| no job (after) | {after.p(50):.1f} | {after.p(99):.1f} | {after.rate:.0f} | "
        f"{after.errors} | |",
        f"| jobs alone (online load off) | | | | | {alone_rate:.0f} |",
        "",
        f"Online p50 with jobs / without: **{ratio:.2f}x** (target <= 1.5x: "
        f"{'met' if ratio <= 1.5 else '**not met**'}). The jobs finished all "
        f"{JOBS * args.images} images after the load stopped.",
    ]
    write_section_as(lines, args.out)
    print("\n".join(lines))


def write_section_as(lines: list[str], path: Path) -> None:
    """Replaces this benchmark's section of results.md; leaves the rest."""
    results.write_section(path, "jobs", "\n".join([TITLE, "", *lines]))


if __name__ == "__main__":
    main()
