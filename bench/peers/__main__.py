"""`python -m bench.peers`: the gateway against what users would pick instead, each door
against its like, in front of the same bench upstream -> a section of bench/results.md.

- gRPC door: the gateway's Detect, seed 002's synchronous grpcio gateway (Detect, the same
  API) and MLServer's Open Inference Protocol `ModelInfer` (the image as one BYTES element);
- HTTP door: the gateway's `POST /v1/models/pixels:detect`, KServe's `POST
  /v1/models/pixels:predict` and MLServer's `POST /v2/models/pixels/infer`, all JSON with
  the image in base64;
- beside each door, its like-for-like do-nothing proxy (bench/proxy.py: receives what the
  gateway receives, forwards the gateway's pixel PredictRequest unread, answers a fixed
  result), so "the gateway's own µs per request" (gateway CPU minus proxy CPU per request,
  same run) is a figure that does not move with the machine the way ratios to other Python
  servers do.

Pixel mode (model `pixels`: every server decodes the JPEG and sends uint8 pixels), JPEG
640x480 and 1920x1080, h2load at concurrency 1 and 16 (HTTP/2 for gRPC, HTTP/1.1
keep-alive for HTTP). Per server and image: requests/s, p50/p99, CPU seconds of the
serving process tree (MLServer's worker process included) per request that reached the
upstream, RSS of that tree (idle, and the most seen under load), start to its first correct
answer. Every server's answer is checked against the boxes, labels and scores the bench
upstream's outputs give before it is measured. Each run starts every process anew; the
figures are medians of the runs with their spread.

    make peers                          # the KServe and MLServer venvs (bench/peers/venvs.py)
    python -m bench.peers [--quick] [--out bench/results.md]

`--quick` (the smoke test) runs one short round on the 640x480 image; its numbers mean
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from bench import photos, results
from bench.host import load_average
from bench.peers.report import report
from bench.peers.runs import FULL, QUICK, one_run
from bench.peers.servers import Images, jpeg_size
from bench.processes import upstream
from bench.results import RESULTS


def _pixels(name: str) -> tuple[int, int]:
    """ "JPEG 640x480" -> (640, 480)."""
    width, height = name.split()[1].split("x")
    return int(width), int(height)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="one short run (the smoke test)")
    parser.add_argument("--runs", type=int, help=f"repeated runs (default {FULL.runs})")
    parser.add_argument("--seconds", type=float, help=f"load per figure (default {FULL.seconds:g})")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    if args.runs is not None:
        scale = dataclasses.replace(scale, runs=args.runs)
    if args.seconds is not None:
        scale = dataclasses.replace(scale, seconds=args.seconds, requests=None)
    files = {name: photos.path_for(*_pixels(name)) for name in scale.images}
    images = Images({name: path.read_bytes() for name, path in files.items()}, files)
    images.sizes = {name: jpeg_size(data) for name, data in images.data.items()}
    load_before, started = load_average(), time.monotonic()
    runs = []
    with upstream() as up:
        for number in range(scale.runs):
            print(f"run {number + 1} of {scale.runs} ...", flush=True)
            runs.append(one_run(up, images, scale, number))
    text = report(runs, scale, started, load_before)
    results.write_section(args.out, "peers", text)
    print(text)


if __name__ == "__main__":
    main()
