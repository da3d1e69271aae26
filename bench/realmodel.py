"""Where the time goes with a real model: the gateway's share of end-to-end latency.

Exports Keras' stock MobileNetV3Small classifier (`keras.applications`, weights=None: random
weights, the real architecture and cost) twice into a temporary model repository:

- `mobilenet_pixels`: uint8 [1,-1,-1,3] pixels in, resized to 224x224 in the graph;
- `mobilenet_encoded`: string [-1] encoded images in, decoded (tf.io.decode_image) and resized
  in the graph;

both with a `probabilities` output (softmax over 1000 classes), so the gateway serves them as
classification models. The local TF Serving stand-in (`python -m serving.local`) serves the
repository; two gateways call it, one without and one with `max_side = 1024` in its model
config (--model-config). For 640x480, 1920x1080 and 12 MP JPEGs, one caller alternates four
calls per round:

  A. direct: the request the gateway sends without max_side (the original JPEG in string
     mode, its full-size pixels in pixel mode), prebuilt, straight to the model server;
  B. the gateway without max_side;
  C. direct: the request the gateway sends with max_side, prebuilt;
  D. the gateway with max_side.

The gateway's share of B is (B - A) / B, of D is (D - C) / D: what is left after the model
server's own time for the exact bytes the gateway sends. D / A, string mode, is the
gateway with max_side against passing the original through (the server decoding it).

Everything runs on one machine over loopback: no network time is in these figures, so the
gateway's share is larger than it would be across a real network, where the smaller request
`max_side` sends would also save transfer time. Writes its section of bench/results.md.

    python -m bench.realmodel [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import grpc

from bench import load, photos, results
from bench.host import load_average, machine
from bench.processes import ROOT, free_port, is_serving, stop_process
from bench.results import RESULTS
from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.domain import ModelRef
from gateway.imaging.header import ImageLimits
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.vision.v1 import model_pb2
from gateway.upstream.client import PREDICT, request_envelope

MODELS = {"pixel": "mobilenet_pixels", "string": "mobilenet_encoded"}
INPUTS = {"pixel": ("images", InputMode.PIXELS), "string": ("image_bytes", InputMode.ENCODED)}
CLASSIFY = "/classification.v1.ClassificationService/Classify"
SIDE = 224
MAX_SIDE = 1024
LIMITS = ImageLimits(max_bytes=64 * 1024 * 1024, max_pixels=50_000_000)


def export(repo: Path) -> None:
    """Both SavedModels, version 1, into `repo` (TensorFlow is imported here only)."""
    import keras
    import tensorflow as tf

    network = keras.applications.MobileNetV3Small(
        input_shape=(SIDE, SIDE, 3), weights=None, classes=1000, include_preprocessing=True
    )

    def classify(pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        """uint8 [n, h, w, 3] -> probabilities [n, 1000] (the network ends in a softmax)."""
        resized = tf.image.resize(tf.cast(pixels, tf.float32), (SIDE, SIDE))
        return {"probabilities": network(resized, training=False)}

    def decode(image_bytes: tf.Tensor) -> tf.Tensor:
        def one(data: tf.Tensor) -> tf.Tensor:
            decoded = tf.io.decode_image(data, channels=3, expand_animations=False)
            decoded.set_shape([None, None, 3])
            return tf.image.resize(tf.cast(decoded, tf.float32), (SIDE, SIDE))

        batch = tf.map_fn(one, image_bytes, fn_output_signature=tf.float32)
        return {"probabilities": network(batch, training=False)}

    endpoints = {
        "mobilenet_pixels": (classify, tf.TensorSpec([1, None, None, 3], tf.uint8, "images")),
        "mobilenet_encoded": (decode, tf.TensorSpec([None], tf.string, "image_bytes")),
    }
    for name, (fn, spec) in endpoints.items():
        # Keras 3 variables are tracked by an ExportArchive (not by tf.Module attributes).
        archive = keras.export.ExportArchive()
        archive.track(network)
        archive.add_endpoint(name="serving_default", fn=fn, input_signature=[spec])
        archive.write_out(str(repo / name / "1"))


@contextmanager
def model_server(repo: Path, names: Iterable[str] = tuple(MODELS.values())) -> Iterator[str]:
    """serving.local serving the models `names` of `repo`."""
    config = repo / "models.config"
    entries = "".join(
        f"config {{ name: '{name}' base_path: '{repo / name}' model_platform: 'tensorflow' }}\n"
        for name in names
    )
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    port = free_port()
    env = dict(os.environ, TFS_LOCAL_BIND_HOST="127.0.0.1", PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.local", f"--port={port}",
         f"--model_config_file={config}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=300)
        yield target
    finally:
        stop_process(process)


@contextmanager
def gateway(upstream: str, config_dir: Path, max_side: int | None) -> Iterator[str]:
    config = config_dir / f"models-{max_side}.toml"
    text = ""
    for name in MODELS.values():
        text += f'[models.{name}]\ntask = "classification"\n'
        if max_side is not None:
            text += f"[models.{name}.input]\nmax_side = {max_side}\n"
    config.write_text(text)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
         f"--upstream={upstream}", f"--model={MODELS['pixel']}", "--metrics-port=0",
         f"--model-config={config}"],
        cwd=ROOT, stderr=subprocess.DEVNULL,  # INFO request logs (the default) to /dev/null
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not is_serving(target):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gateway did not become SERVING")
            time.sleep(0.01)
        yield target
    finally:
        stop_process(process)


def direct_request(data: bytes, mode: str, max_side: int | None) -> bytes:
    """The PredictRequest the gateway sends for `data` (gateway.core.inputs, same plan)."""
    key, input_mode = INPUTS[mode]
    envelope = request_envelope(ModelRef(MODELS[mode]), ("probabilities",))
    plan = InputPlan(key, input_mode, max_side=max_side)
    return build_input(data, plan, envelope, LIMITS).request


def measure(
    upstream: str, gateways: dict[int | None, str], data: bytes, mode: str, calls: int
) -> dict[str, list[float]]:
    """Milliseconds per call of A, B, C, D (module docstring), alternating call by call."""
    channels = {t: grpc.insecure_channel(t, options=load.CHANNEL_OPTIONS)
                for t in (upstream, *gateways.values())}  # fmt: skip
    body = cpb.ClassifyRequest(image=data, model=model_pb2.ModelSpec(name=MODELS[mode]))
    gateway_body = body.SerializeToString()
    cases: dict[str, Callable[[], object]] = {}
    for letter, max_side in (("A", None), ("C", MAX_SIDE)):
        predict = channels[upstream].unary_unary(PREDICT)
        cases[letter] = partial(predict, direct_request(data, mode, max_side), timeout=300)
    for letter, max_side in (("B", None), ("D", MAX_SIDE)):
        classify = channels[gateways[max_side]].unary_unary(CLASSIFY)
        cases[letter] = partial(classify, gateway_body, timeout=300)
    cases = dict(sorted(cases.items()))
    try:
        for case in cases.values():  # warm-up: graph tracing per input size, signatures
            case()
            case()
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(calls):
            for letter, case in cases.items():
                started = time.perf_counter()
                case()
                times[letter].append((time.perf_counter() - started) * 1e3)
        return times
    finally:
        for channel in channels.values():
            channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="one small image, few calls")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    chosen = photos.load()
    names = ["JPEG 640x480"] if args.quick else ["JPEG 640x480", "JPEG 1920x1080", "JPEG 4032x3024"]
    rounds = 1 if args.quick else args.rounds
    load_before = load_average()
    started = time.monotonic()
    rows = []
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        print("exporting MobileNetV3Small ...", flush=True)
        subprocess.run(
            [sys.executable, "-c", f"from bench.realmodel import export; "
             f"from pathlib import Path; export(Path({str(repo)!r}))"],
            cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        with (
            model_server(repo) as up,
            gateway(up, repo, None) as plain,
            gateway(up, repo, MAX_SIDE) as scaled,
        ):
            gateways = {None: plain, MAX_SIDE: scaled}
            for name in names:
                data = chosen[name]
                big = "4032" in name
                for mode in MODELS:
                    print(f"{name} {mode} ...", flush=True)
                    runs = []
                    for _ in range(rounds):
                        calls = 3 if args.quick else (7 if big else 15)
                        times = measure(up, gateways, data, mode, calls)
                        runs.append({k: statistics.median(v) for k, v in times.items()})
                        if big and mode == "string":
                            ratios.append(runs[-1]["D"] / runs[-1]["A"])
                    sizes = (
                        len(direct_request(data, mode, None)),
                        len(direct_request(data, mode, MAX_SIDE)),
                    )
                    rows.append((name, mode, runs, sizes))
    lines = _report(rows, ratios, load_before, time.monotonic() - started, rounds)
    text = "\n".join(lines)
    results.write_section(args.out, "realmodel", text)
    print(text)


def _report(
    rows: list[tuple[str, str, list[dict[str, float]], tuple[int, int]]],
    ratios: list[float],
    load_before: str,
    seconds: float,
    rounds: int,
) -> list[str]:
    def spread(values: list[float], fmt: str) -> str:
        if len(values) == 1:
            return fmt.format(values[0])
        return (
            f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(min(values))} to {fmt.format(max(values))})"
        )

    lines = [
        "## 6. A real model: the gateway's share of end-to-end latency",
        "",
        f"`python -m bench.realmodel` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{seconds:.0f} s: {machine()}. Load average {load_before} before, {load_average()} "
        "after. Keras' MobileNetV3Small (weights=None: random weights, the real architecture), "
        "resizing to 224x224 in the graph, served by the local TF Serving stand-in "
        "(`python -m serving.local`, TensorFlow); gateway, model server and client share the "
        "2 cores, over loopback (no network time: across a network the gateway's share is "
        "smaller, and `max_side`'s smaller requests also save transfer time). Concurrency 1, "
        f"one caller alternating the four calls; medians per run, {rounds} runs: "
        '"median (min to max)" of the run medians.',
        "",
        "| image | mode | direct, as sent without max_side (A) | gateway (B) | gateway's "
        "share of B | direct, as sent with max_side 1024 (C) | gateway, max_side 1024 (D) "
        "| gateway's share of D | bytes sent without / with max_side |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, mode, runs, (full, scaled) in rows:
        col = {k: [r[k] for r in runs] for k in "ABCD"}
        share_b = [(r["B"] - r["A"]) / r["B"] * 100 for r in runs]
        share_d = [(r["D"] - r["C"]) / r["D"] * 100 for r in runs]
        lines.append(
            f"| {name} | {mode} | {spread(col['A'], '{:.1f}')} ms | {spread(col['B'], '{:.1f}')}"
            f" ms | {spread(share_b, '{:.0f}')} % | {spread(col['C'], '{:.1f}')} ms "
            f"| {spread(col['D'], '{:.1f}')} ms | {spread(share_d, '{:.0f}')} % "
            f"| {full:,} / {scaled:,} B |"
        )
    if ratios:
        met = sum(r <= 0.5 for r in ratios)
        lines += [
            "",
            "Target: 12 MP JPEG, string mode, `max_side` 1024, end to end <= 0.5x of passing "
            "the original through (the model server decoding it in the graph): D / A = "
            f"{spread(ratios, '{:.2f}x')}; met in {met} of {len(ratios)} runs.",
        ]
    return lines


if __name__ == "__main__":
    main()
