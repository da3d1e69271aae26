"""`python -m bench.batch`: images/s of `detection-batch` through the gateway against the
fast canned upstream (bench/upstream.py), next to the gateway's own throughput at the same
concurrency, in one run -> the "Batch runner" section of bench/results.md (one per mode).

The dataset is a local directory of copies of bench/images/photo_640x480.jpg. The gateway's
throughput is measured with bench/load.py's closed loop on unary Detect (h2load when
installed, else its Python clients). Runs go in the order gateway, runner, runner, gateway,
so a load spike from elsewhere on the shared machine is less likely to land on one side;
each side's figure is the mean of its two runs. The runner's images/s is wall time from
process start to exit (listing, reading, sending, writing, checkpoints, markers included).
Target: the runner reaches at least 0.8x the gateway's throughput.

    python -m bench.batch [--images 4000] [--concurrency 32] [--mode pixel|string]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import load, results
from bench.host import load_average, machine
from bench.processes import ROOT, gateway, upstream
from bench.results import RESULTS
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2

TITLE = "## Batch runner (`python -m bench.batch`, {mode} mode)"
PHOTO = ROOT / "bench" / "images" / "photo_640x480.jpg"
MODELS = {"pixel": "pixels", "string": "encoded"}


def runner(target: str, source: Path, out: Path, model: str, concurrency: int) -> dict:
    command = [
        sys.executable, "-m", "gateway.jobs.runner", str(source), str(out),
        f"--target={target}", f"--model={model}", f"--concurrency={concurrency}",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"detection-batch failed:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall": wall, "images": summary["images"], "errors": summary["errors"],
            "own_rate": summary["this_run"]["images_per_second"]}  # fmt: skip


def write_section(lines: list[str], path: Path, mode: str) -> None:
    """Replaces this benchmark's section of results.md (one per mode); leaves the rest."""
    text = "\n".join([TITLE.format(mode=mode), "", *lines])
    results.write_section(path, f"batch-{mode}", text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--mode", choices=tuple(MODELS), default="pixel")
    parser.add_argument("--seconds", type=float, default=8.0, help="per gateway load run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    model = MODELS[args.mode]
    jpeg = PHOTO.read_bytes()
    body = pb.DetectRequest(image=jpeg, model=model_pb2.ModelSpec(name=model)).SerializeToString()
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "images"
        source.mkdir()
        for n in range(args.images):
            (source / f"{n:06d}.jpg").write_bytes(jpeg)
        gateway_rates: list[float] = []
        runs: list[dict] = []
        with upstream() as up, gateway(up) as gw:
            for step, side in enumerate(("gateway", "runner", "runner", "gateway")):
                if side == "gateway":
                    result = load.closed_loop(
                        gw.target, load.DETECT, body, args.concurrency, args.seconds
                    )
                    gateway_rates.append(result.rate)
                else:
                    out = Path(tmp) / f"out-{step}"
                    runs.append(runner(gw.target, source, out, model, args.concurrency))
    gateway_rate = sum(gateway_rates) / len(gateway_rates)
    runner_rates = [r["images"] / r["wall"] for r in runs]
    runner_rate = sum(runner_rates) / len(runner_rates)
    ratio = runner_rate / gateway_rate
    command = (
        f"python -m bench.batch --images {args.images} --concurrency {args.concurrency} "
        f"--mode {args.mode}"
    )
    lines = [
        f"`{command}` on {began}: {machine()}. Load average before {load_before}, after "
        f"{load_average()} (shared machine: upstream, gateway, load generator or runner all "
        "on the same cores).",
        "",
        f"Gateway: unary Detect, closed loop at concurrency {args.concurrency} "
        f"({load.generator()}), {args.seconds:g} s per run. Runner: `detection-batch` on a "
        f"directory of {args.images} copies of the 640x480 JPEG, `--concurrency "
        f"{args.concurrency}` (DetectStream, window 4), {args.mode} mode (model "
        f"`{model}`); images/s from process start to exit.",
        "",
        "| run | images/s | notes |",
        "|---|---|---|",
        f"| gateway, run 1 | {gateway_rates[0]:.0f} | |",
        f"| runner, run 1 | {runner_rates[0]:.0f} | {runs[0]['images']} images in "
        f"{runs[0]['wall']:.1f} s ({runs[0]['own_rate']} while sending), "
        f"{runs[0]['errors']} errors |",
        f"| runner, run 2 | {runner_rates[1]:.0f} | {runs[1]['images']} images in "
        f"{runs[1]['wall']:.1f} s ({runs[1]['own_rate']} while sending), "
        f"{runs[1]['errors']} errors |",
        f"| gateway, run 2 | {gateway_rates[1]:.0f} | |",
        "",
        f"Runner / gateway: **{ratio:.2f}x** (target >= 0.8x: "
        f"{'met' if ratio >= 0.8 else '**not met**'}).",
    ]
    write_section(lines, args.out, args.mode)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
