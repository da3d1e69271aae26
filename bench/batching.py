"""`python -m bench.batching`: many images, one Predict (issue 37.4), batching on against off.

Two upstreams, each behind two gateways started side by side from the same code, one with the
model's default batching (`[models.NAME.batching]` unset: on, since the signature's batch
dimension is free) and one with `batching.enabled = false`:

- `upstream`: the canned bench upstream's `classifier` (uint8 [-1,224,224,3] in, 1000 scores
  per image out), answering each Predict after `--delay-ms` without using CPU (a model's time
  per call, which batching can share), so the gateway's own costs show;
- `mobilenet`: the local TF Serving stand-in (`serving.local`) running Keras' MobileNetV3Small
  (random weights, the real architecture and cost) exported with a fixed [-1,224,224,3] uint8
  input, so the model server runs each batch as one call (exported once per machine and
  content of the export, `mobilenet`).

Callers send Classify with the 640x480 JPEG (decoded and resized to 224x224 by the gateway),
closed loop with h2load at concurrency 1, 16 and 64. Each concurrency runs `--rounds` rounds
of both gateways, `--seconds` each after a warm-up, alternating which goes first, so machine
noise falls on both alike. Per run: throughput, p50/p99, the gateway process's CPU per image
(/proc), and upstream calls per image (the gateway's `vision_gateway_upstream_batch_size`
histogram: its count is Predict calls, its sum images). Verdicts against the issue's targets
are computed here. -> the "batching" section of bench/results.md.

Against the bench upstream, MLServer 1.7 (its venv: `make peers`) with adaptive batching on
(`max_batch_size` 8, `max_batch_time` 5 ms: bench/peers/mlserver_classifier.py) takes the
same image over its gRPC `ModelInfer` at concurrency 16 and 64, in the same rounds: its CPU
(server and worker processes) and upstream calls per image, counted at the upstream.

    python -m bench.batching [--seconds 5] [--rounds 2] [--delay-ms 5] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc

from bench import load, processes
from bench.host import cpu_seconds, load_average, machine
from bench.peers import venvs
from bench.peers.processes import Process, process
from bench.processes import ROOT, free_port
from bench.processes import upstream as canned_upstream
from bench.realmodel import model_server
from bench.results import RESULTS, spread, verdict, write_section
from bench.upstream import CLASSIFIER, classified
from gateway.proto.classification.v1 import classification_pb2 as cpb
from tests.support import machinecache

PHOTO = ROOT / "bench" / "images" / "photo_640x480.jpg"
CLASSIFY = "/classification.v1.ClassificationService/Classify"
MOBILENET = "mobilenet_fixed"
SIDE = 224
CONCURRENCY = (1, 16, 64)
MODES = ("on", "off")
MLSERVER_CONCURRENCY = (16, 64)
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass
class Run:
    rate: float
    p50: float
    p99: float
    cpu_us: float  # gateway CPU per image
    calls: float  # upstream calls per image
    errors: int


def mobilenet_key() -> str:
    """What makes the export: its code and the TensorFlow and Keras that run it."""
    from importlib.metadata import version

    digest = hashlib.sha256(inspect.getsource(export_mobilenet).encode())
    digest.update(f"{SIDE} {version('tensorflow')} {version('keras')}".encode())
    return digest.hexdigest()[:16]


def mobilenet(repo: Path) -> None:
    """The export in `repo`, copied from the one built once per machine and content
    (tests/support/machinecache.py: ~/.cache/tfs-detection-gateway/bench-mobilenet/<key>),
    so a run does not import TensorFlow and export again (about 20 s)."""
    built = machinecache.build_once("bench-mobilenet", mobilenet_key(), export_mobilenet)
    shutil.copytree(built / MOBILENET, repo / MOBILENET)


def export_mobilenet(repo: Path) -> None:
    """MobileNetV3Small with a fixed-size uint8 input and a free batch dimension."""
    import keras
    import tensorflow as tf

    network = keras.applications.MobileNetV3Small(
        input_shape=(SIDE, SIDE, 3), weights=None, classes=1000, include_preprocessing=True
    )

    def classify(pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"probabilities": network(tf.cast(pixels, tf.float32), training=False)}

    archive = keras.export.ExportArchive()
    archive.track(network)
    spec = tf.TensorSpec([None, SIDE, SIDE, 3], tf.uint8, "images")
    archive.add_endpoint(name="serving_default", fn=classify, input_signature=[spec])
    archive.write_out(str(repo / MOBILENET / "1"))


@contextmanager
def gateway(upstream: str, model: str, batching: bool) -> Iterator[processes.Gateway]:
    """The gateway serving `model` as a classifier, its batching on or off."""
    text = f'[models.{model}]\ntask = "classification"\n'
    if not batching:
        text += f"[models.{model}.batching]\nenabled = false\n"
    with processes.gateway(upstream, model_config=text, model=model) as gw:
        yield gw


def body(model: str) -> bytes:
    request = cpb.ClassifyRequest(image=PHOTO.read_bytes())
    request.model.name = model
    return request.SerializeToString()


def _measure(
    target: str,
    method: str,
    payload: bytes,
    concurrency: int,
    seconds: float,
    cpu: Callable[[], float],
    counts: Callable[[], tuple[float, float]],
) -> Run:
    """One closed-loop run; `cpu` reads the server's CPU seconds, `counts` its (upstream
    calls, images) so far."""
    calls0, images0 = counts()
    cpu0 = cpu()
    latencies = load.closed_loop(target, method, payload, concurrency, seconds, warmup=1.0)
    spent = cpu() - cpu0
    calls1, images1 = counts()
    images, calls = images1 - images0, calls1 - calls0
    return Run(
        rate=latencies.rate,
        p50=latencies.p(50),
        p99=latencies.p(99),
        cpu_us=spent / images * 1e6 if images else float("nan"),
        calls=calls / images if images else float("nan"),
        errors=latencies.errors,
    )


def measure(
    gw: processes.Gateway, model: str, payload: bytes, concurrency: int, seconds: float
) -> Run:
    def cpu() -> float:
        return cpu_seconds([gw.process.pid])

    counts = partial(gw.batch_counts, model)
    return _measure(gw.target, CLASSIFY, payload, concurrency, seconds, cpu, counts)


@dataclass
class MLServer:
    process: Process
    target: str
    body: bytes


@contextmanager
def mlserver(upstream: str, workdir: Path) -> Iterator[MLServer]:
    """MLServer serving the classifier with adaptive batching, ready to answer."""
    python = str(venvs.python("mlserver"))
    folder = workdir / "mlserver"
    folder.mkdir(exist_ok=True)
    request = workdir / "oip-classify.bin"
    subprocess.run(
        [python, "-m", "bench.peers.mlserver_tool", "body", str(PHOTO), str(request),
         f"--model={CLASSIFIER}"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    grpc_port = free_port()
    command = [python, "-m", "bench.peers.mlserver_tool", "serve", f"--folder={folder}",
               f"--http-port={free_port()}", f"--grpc-port={grpc_port}",
               f"--metrics-port={free_port()}", f"--upstream={upstream}",
               f"--model={CLASSIFIER}"]  # fmt: skip
    with process("MLServer", command, workdir) as proc:
        server = MLServer(proc, f"127.0.0.1:{grpc_port}", request.read_bytes())
        deadline = time.monotonic() + 300
        while True:  # until the model answers (MLServer loads it in its worker)
            proc.check_alive()
            try:
                with grpc.insecure_channel(server.target) as channel:
                    channel.unary_unary(MODEL_INFER)(server.body, timeout=10)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise RuntimeError("MLServer did not answer") from None
                time.sleep(0.2)
        yield server


def measure_mlserver(server: MLServer, upstream: str, concurrency: int, seconds: float) -> Run:
    def counts() -> tuple[float, float]:
        return classified(upstream)

    return _measure(server.target, MODEL_INFER, server.body, concurrency, seconds,
                    server.process.cpu_seconds, counts)  # fmt: skip


def scenario(
    upstream: str, model: str, args: argparse.Namespace, workdir: Path, peer: bool = False
) -> dict[int, dict[str, list[Run]]]:
    """Runs per concurrency and mode; both gateways (and MLServer with `peer`) alive
    throughout, measured in turn."""
    payload = body(model)
    runs: dict[int, dict[str, list[Run]]] = {c: {m: [] for m in MODES} for c in CONCURRENCY}
    with ExitStack() as stack:
        on = stack.enter_context(gateway(upstream, model, True))
        off = stack.enter_context(gateway(upstream, model, False))
        peer_server = stack.enter_context(mlserver(upstream, workdir)) if peer else None
        gateways = {"on": on, "off": off}
        for gw in gateways.values():  # first calls: signature fetch, warm caches
            load.closed_loop(gw.target, CLASSIFY, payload, 4, 1.0, warmup=0.5)
        for concurrency in CONCURRENCY:
            for round_ in range(args.rounds):
                order = MODES if round_ % 2 == 0 else MODES[::-1]
                for mode in order:
                    run = measure(gateways[mode], model, payload, concurrency, args.seconds)
                    runs[concurrency][mode].append(run)
                    print(f"{model} c{concurrency} {mode}: {run}", flush=True)
                if peer_server is not None and concurrency in MLSERVER_CONCURRENCY:
                    run = measure_mlserver(peer_server, upstream, concurrency, args.seconds)
                    runs[concurrency].setdefault("MLServer", []).append(run)
                    print(f"MLServer c{concurrency}: {run}", flush=True)
    return runs


def _row(c: int, mode: str, runs: list[Run]) -> str:
    def col(values: list[float], fmt: str) -> str:
        return spread(values, fmt)

    return (
        f"| c{c} | {mode} | {col([r.rate for r in runs], '{:.0f}')} | "
        f"{col([r.p50 for r in runs], '{:.2f}')} | {col([r.p99 for r in runs], '{:.2f}')} | "
        f"{col([r.cpu_us for r in runs], '{:,.0f}')} | {col([r.calls for r in runs], '{:.3f}')} "
        f"| {sum(r.errors for r in runs)} |"
    )


def _table(runs: dict[int, dict[str, list[Run]]]) -> list[str]:
    lines = [
        "| concurrency | batching | images/s | p50 ms | p99 ms | gateway CPU µs/image | "
        "upstream calls/image | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, modes in runs.items():
        lines += [_row(c, mode, runs) for mode, runs in modes.items()]
    return lines


def _p50_within(on: list[Run], off: list[Run]) -> str:
    """c1: is batching's p50 within the unbatched p50's spread (at most its highest)?"""
    top = max(r.p50 for r in off)
    return verdict([r.p50 for r in on], lambda p: p <= top)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per run, after 1 s warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each gateway per case")
    parser.add_argument("--delay-ms", type=float, default=5.0, help="the bench upstream's time")
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 round (smoke test)")
    parser.add_argument("--no-peer", action="store_true", help="without MLServer")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        peer = (venvs.directory() / "mlserver" / venvs.COMPLETE).exists() and not args.no_peer
        with canned_upstream(args.delay_ms) as up:
            canned = scenario(up, CLASSIFIER, args, work, peer=peer)
        mobilenet(work / "repo")
        with model_server(work / "repo", [MOBILENET]) as server:
            real = scenario(server, MOBILENET, args, work)
    command = (
        f"python -m bench.batching --seconds {args.seconds:g} --rounds {args.rounds} "
        f"--delay-ms {args.delay_ms:g}"
    )
    c16_on, c16_off = canned[16]["on"], canned[16]["off"]
    cpu_ratio = [a.cpu_us / b.cpu_us for a, b in zip(c16_on, c16_off, strict=True)]
    real_ratio = [a.rate / b.rate for a, b in zip(real[16]["on"], real[16]["off"], strict=True)]
    peer_runs = canned[16].get("MLServer", [])
    peer_ratio = [a.cpu_us / b.cpu_us for a, b in zip(c16_on, peer_runs, strict=False)]
    if peer_runs:
        peer_row = (
            f"| c16, bench upstream: gateway CPU per image <= 0.33x MLServer's with adaptive "
            f"batching | {spread(peer_ratio)}x | {verdict(peer_ratio, lambda v: v <= 0.33)} |"
        )
    else:
        peer_row = (
            "| c16, bench upstream: gateway CPU per image <= 0.33x MLServer's with adaptive "
            "batching | not measured: MLServer's venv is not built (`make peers`) | |"
        )
    text = "\n".join(
        [
            "## Batching in the gateway, on against off (`python -m bench.batching`)",
            "",
            f"`{command}` on {began}: {machine()}; generator {load.generator()}. Load average "
            f"before {load_before}, after {load_average()} (a shared machine: callers, "
            "gateways and upstream on the same 2 cores). Classify with the 640x480 JPEG, "
            "decoded and resized to 224x224 by the gateway; closed loop; both gateways run "
            f"side by side, measured in turn ({args.rounds} rounds of {args.seconds:g} s each, "
            "alternating which goes first); spreads are median (min to max) over the rounds.",
            "",
            f"### The bench upstream's fixed-size classifier ({args.delay_ms:g} ms per call, "
            "no CPU)",
            "",
            "MLServer: 1.7 with adaptive batching (`max_batch_size` 8, `max_batch_time` "
            "0.005 s), a custom runtime decoding and resizing with Pillow, over gRPC "
            "`ModelInfer`; its CPU is its server and worker processes'; its upstream calls are "
            "counted at the upstream.",
            "",
            *_table(canned),
            "",
            "### MobileNetV3Small [-1,224,224,3] on serving.local (random weights)",
            "",
            *_table(real),
            "",
            "### Targets",
            "",
            "| target | measured | verdict |",
            "|---|---|---|",
            f"| c16, bench upstream: upstream calls per image <= 0.25 | "
            f"{spread([r.calls for r in c16_on], '{:.3f}')} | "
            f"{verdict([r.calls for r in c16_on], lambda v: v <= 0.25)} |",
            f"| c16, bench upstream: gateway CPU per image no higher than unbatched | "
            f"{spread(cpu_ratio)}x of unbatched | {verdict(cpu_ratio, lambda v: v <= 1.0)} |",
            f"| c16, MobileNetV3Small: throughput >= 1.5x unbatched | {spread(real_ratio)}x | "
            f"{verdict(real_ratio, lambda v: v >= 1.5)} |",
            peer_row,
            f"| c1, bench upstream: p50 within the unbatched p50's spread | "
            f"{spread([r.p50 for r in canned[1]['on']])} against "
            f"{spread([r.p50 for r in canned[1]['off']])} ms | "
            f"{_p50_within(canned[1]['on'], canned[1]['off'])} |",
            f"| c1, MobileNetV3Small: p50 within the unbatched p50's spread | "
            f"{spread([r.p50 for r in real[1]['on']])} against "
            f"{spread([r.p50 for r in real[1]['off']])} ms | "
            f"{_p50_within(real[1]['on'], real[1]['off'])} |",
        ]
    )
    write_section(args.out, "batching", text)
    print(text)


if __name__ == "__main__":
    main()
