"""`python -m bench.pipelines`: detect, then classify each box, in one call against the caller
doing it itself (issue 45).

The gateway with `make run`'s model config (serving/gateway-models.toml: pipeline
`detect_then_classify` = `detector`, then `classifier_scores` on each box's crop; the
classifier batches by default, max_batch 8) in front of the local TF Serving stand-in
(`serving.local`) serving the reference models. The image: a generated 640x480 scene
(serving.scenes, seed SEED) as a JPEG, on which the detector finds exactly 8 boxes at
min_score 0.5 (checked before anything is measured). Per image, from one Python gRPC client
process (sync stubs, one thread per concurrent caller, one channel):

- `pipeline`: one `pipeline.v1.PipelineService/Run`;
- `caller, in turn`: Detect, then the caller decodes the image (Pillow), cuts each box's crop
  and encodes it as a JPEG (quality 90), and sends one Classify per crop, one after another;
- `caller, at once`: the same, with the 8 Classify calls in flight together (futures), as a
  caller who wants the coalescer to batch its crops would write it.

Closed loop at concurrency 1 and 8 (each way warmed up first), `--rounds` rounds of
`--seconds` each, the three ways in turn with the order rotating per round, so machine noise
falls on all alike; each run ends when its callers have finished the image they were on, so
every image counted was done inside the measured window. Per run: images/s, p50/p99 of the
wall time per image, the CPU per image of the gateway, the client and serving.local (/proc),
and upstream Predict calls per crop (the gateway's `vision_gateway_upstream_batch_size`
histogram for classifier_scores: its count is Predict calls, its sum crops). Targets (issue
45): gateway+client CPU per image at least 2x lower for the pipeline than for the caller, and
at most 0.3 upstream calls per crop at concurrency 8. -> the "pipelines" section of
bench/results.md.

    python -m bench.pipelines [--seconds 6] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from bench.host import cpu_seconds, load_average, machine
from bench.pipelinecalls import (
    BOXES,
    CHANNEL_OPTIONS,
    CLASSIFIER,
    DETECTOR,
    HEIGHT,
    JPEG_QUALITY,
    MIN_SCORE,
    PIPELINE,
    SEED,
    WAYS,
    WIDTH,
    Caller,
    closed_loop,
    own_cpu,
    scene_image,
)
from bench.processes import ROOT, Gateway, gateway
from bench.results import RESULTS, spread, verdict, write_section
from tests.support.localserver import LocalServer, run_local_server

MODEL_CONFIG = ROOT / "serving" / "gateway-models.toml"
CONCURRENCY = (1, 8)
TARGET_CPU, TARGET_CALLS = 2.0, 0.3


def model_config() -> str:
    """make run's model config, its label paths made absolute (it is read from elsewhere)."""
    text = MODEL_CONFIG.read_text()
    for key in ("label_map", "labels"):
        text = text.replace(f'{key} = "', f'{key} = "{MODEL_CONFIG.parent}/')
    return text


@contextmanager
def model_server(directory: Path) -> Iterator[LocalServer]:
    """serving.local serving the pipeline's two reference models (tests/support/models.py's
    export cache, read in place)."""
    # tests/support/models.py's command: the cache's path, exported first if it is missing.
    said = subprocess.run(
        [sys.executable, "-m", "tests.support.models"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    repo = Path(said.stdout.strip().rsplit(": ", 1)[1])
    entries = "".join(
        f"  config {{ name: '{n}' base_path: '{repo / n}' model_platform: 'tensorflow' }}\n"
        for n in (DETECTOR, CLASSIFIER)
    )
    config = directory / "models.config"
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={config}"], log_dir=directory) as server:
        yield server


@dataclass
class Run:
    rate: float  # images per second
    p50: float  # ms per image
    p99: float
    gateway_us: float  # CPU per image
    client_us: float
    serving_us: float
    calls: float  # upstream Predict calls per crop, classifier_scores
    detect_calls: float  # upstream Predict calls per image, detector
    errors: int

    @property
    def ours_us(self) -> float:
        """Gateway + client CPU per image: what the target compares."""
        return self.gateway_us + self.client_us


def measure(
    gw: Gateway, server: LocalServer, caller: Caller, way: str, concurrency: int, seconds: float
) -> Run:
    work = caller.way(way)
    assert server.process is not None
    pids = {"gateway": gw.process.pid, "serving": server.process.pid}
    calls0, crops0 = gw.batch_counts(CLASSIFIER)
    detects0, _ = gw.batch_counts(DETECTOR)
    cpu0 = {name: cpu_seconds([pid]) for name, pid in pids.items()}
    own0 = own_cpu()
    latencies, errors, took = closed_loop(work, concurrency, seconds)
    own = own_cpu() - own0
    cpu = {name: cpu_seconds([pid]) - cpu0[name] for name, pid in pids.items()}
    calls1, crops1 = gw.batch_counts(CLASSIFIER)
    detects1, _ = gw.batch_counts(DETECTOR)
    images = len(latencies)
    per = 1e6 / images if images else float("nan")
    ms = np.asarray(latencies) if latencies else np.asarray([float("nan")])
    return Run(
        rate=images / took,
        p50=float(np.percentile(ms, 50)),
        p99=float(np.percentile(ms, 99)),
        gateway_us=cpu["gateway"] * per,
        client_us=own * per,
        serving_us=cpu["serving"] * per,
        calls=(calls1 - calls0) / (crops1 - crops0) if crops1 > crops0 else float("nan"),
        detect_calls=(detects1 - detects0) / images if images else float("nan"),
        errors=errors,
    )


def check_scene(caller: Caller) -> None:
    """The picture has exactly BOXES detected boxes at MIN_SCORE, and the pipeline crops each
    one; refuses to measure otherwise."""
    found = caller.detect(caller.detect_request, timeout=120).detections
    if len(found) != BOXES:
        raise SystemExit(
            f"the benchmark's scene (seed {SEED}) has {len(found)} boxes at min_score "
            f"{MIN_SCORE}, not {BOXES}: the reference detector or serving.scenes changed; pick "
            "a seed that gives 8 (bench/pipelines.py SEED)"
        )
    caller.pipeline()


def rounds(
    gw: Gateway, server: LocalServer, caller: Caller, args: argparse.Namespace
) -> dict[int, dict[str, list[Run]]]:
    runs: dict[int, dict[str, list[Run]]] = {c: {w: [] for w in WAYS} for c in CONCURRENCY}
    for concurrency in CONCURRENCY:
        for way in WAYS:  # warm-up: each way's first images at this concurrency
            closed_loop(caller.way(way), concurrency, 0.5)
        for round_ in range(args.rounds):
            shift = round_ % len(WAYS)
            for way in WAYS[shift:] + WAYS[:shift]:
                run = measure(gw, server, caller, way, concurrency, args.seconds)
                runs[concurrency][way].append(run)
                print(f"c{concurrency} {way}: {run}", flush=True)
    return runs


def _row(concurrency: int, way: str, runs: Sequence[Run]) -> str:
    def col(values: list[float], fmt: str) -> str:
        return spread(values, fmt)

    return (
        f"| c{concurrency} | {way} | {col([r.rate for r in runs], '{:.1f}')} | "
        f"{col([r.p50 for r in runs], '{:.1f}')} | {col([r.p99 for r in runs], '{:.1f}')} | "
        f"{col([r.gateway_us / 1e3 for r in runs], '{:.2f}')} | "
        f"{col([r.client_us / 1e3 for r in runs], '{:.2f}')} | "
        f"{col([r.ours_us / 1e3 for r in runs], '{:.2f}')} | "
        f"{col([r.serving_us / 1e3 for r in runs], '{:.1f}')} | "
        f"{col([r.calls for r in runs], '{:.3f}')} | {sum(r.errors for r in runs)} |"
    )


def _ratios(runs: dict[str, list[Run]], way: str, field: str) -> list[float]:
    """`way`'s figure over the pipeline's, run by run (the runs of one round side by side)."""
    return [
        getattr(b, field) / getattr(a, field) for a, b in zip(runs[WAYS[0]], runs[way], strict=True)
    ]


def report(runs: dict[int, dict[str, list[Run]]], args: argparse.Namespace, began: str,
           load_before: str, image: bytes) -> str:  # fmt: skip
    command = f"python -m bench.pipelines --seconds {args.seconds:g} --rounds {args.rounds}"
    table = [
        "| concurrency | way | images/s | p50 ms | p99 ms | gateway CPU ms/image | "
        "client CPU ms/image | gateway+client CPU ms/image | serving.local CPU ms/image | "
        "upstream calls/crop | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for concurrency, ways in runs.items():
        table += [_row(concurrency, way, ways[way]) for way in WAYS]
    targets = ["| target | measured | verdict |", "|---|---|---|"]
    for concurrency, ways in runs.items():
        for way in WAYS[1:]:
            cpu = _ratios(ways, way, "ours_us")
            targets.append(
                f"| c{concurrency}: gateway+client CPU per image >= {TARGET_CPU:g}x lower than "
                f"{way} | {spread(cpu)}x lower | "
                f"{verdict(cpu, lambda v: v >= TARGET_CPU)} |"
            )
    calls = [r.calls for r in runs[8][WAYS[0]]]
    targets.append(
        f"| c8: pipeline's upstream calls per crop <= {TARGET_CALLS:g} | "
        f"{spread(calls, '{:.3f}')} | {verdict(calls, lambda v: v <= TARGET_CALLS)} |"
    )
    walls = [
        f"*{way}* {spread(_ratios(runs[c], way, 'p50'))}x the pipeline's p50 and "
        f"{spread(_ratios(runs[c], way, 'rate'))}x its images/s at concurrency {c}"
        for c in CONCURRENCY
        for way in WAYS[1:]
    ]
    return "\n".join(
        [
            "## Detect, then classify each box: the pipeline against the caller doing it "
            "(`python -m bench.pipelines`)",
            "",
            f"`{command}` on {began}: {machine()}. Load average before {load_before}, after "
            f"{load_average()} (a shared machine: client, gateway and serving.local on the "
            "same 2 cores).",
            "",
            f"The gateway with `make run`'s model config in front of serving.local (the "
            f"reference models, TensorFlow): pipeline `{PIPELINE}` = `{DETECTOR}`, then "
            f"`{CLASSIFIER}` (float32 [-1,224,224,3], batching on: its default, max_batch 8) on "
            f"each box's crop. The image: a {WIDTH}x{HEIGHT} generated scene (serving.scenes, "
            f"seed {SEED}) as a JPEG of {len(image) // 1024} KB, in which the detector finds "
            f"{BOXES} boxes at min_score {MIN_SCORE:g} (checked before measuring). One Python "
            "gRPC client process (sync stubs, a thread per concurrent caller) does, per image: "
            "*pipeline*: one `PipelineService/Run`; *caller, in turn*: Detect, then decodes the "
            f"image with Pillow, cuts each box and encodes it as a JPEG (quality {JPEG_QUALITY}) "
            "and sends one Classify per crop, one after another; *caller, at once*: the same "
            f"with the {BOXES} Classify calls in flight together. Closed loop, {args.rounds} "
            f"rounds of {args.seconds:g} s per way and concurrency, the ways in turn (the order "
            "rotating per round); spreads are median (min to max) over the rounds. CPU per "
            "image from /proc (the gateway and serving.local processes) and the client's own "
            "process times; upstream calls per crop from the gateway's "
            f"`vision_gateway_upstream_batch_size` histogram for `{CLASSIFIER}` (its count over "
            "its sum).",
            "",
            *table,
            "",
            f"Wall time, run by run against the pipeline's: {'; '.join(walls)}.",
            "",
            "### Targets",
            "",
            *targets,
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pipelines", description=__doc__)
    parser.add_argument("--seconds", type=float, default=6.0, help="per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each way per concurrency")
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 round (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be above 0 and --rounds at least 1")
    image = scene_image()
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with (
            model_server(directory) as server,
            gateway(server.target, model_config=model_config()) as gw,
            grpc.insecure_channel(gw.target, options=CHANNEL_OPTIONS) as channel,
        ):
            caller = Caller(channel, image)
            check_scene(caller)
            runs = rounds(gw, server, caller, args)
    text = report(runs, args, began, load_before, image)
    write_section(args.out, "pipelines", text)
    print(text)


if __name__ == "__main__":
    main()
