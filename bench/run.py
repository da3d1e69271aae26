"""Benchmarks, run by hand (`make bench`); results are written to bench/RESULTS.md.

Everything is measured in one run on one machine, so the ratios are meaningful even on a
noisy shared host; the absolute numbers are this machine's.

1. Tensor encoding: a 1080p uint8 image as `tensor_content` (what the gateway sends) vs the
   typed `int_val` field; reading detection outputs from `float_val` vs `tensor_content`.
2. Latency: the same JPEG via the gateway vs straight to TF Serving with the official client
   (which has to decode the image itself), for both reference models; the difference is the
   gateway's cost.
3. Throughput through the gateway at a fixed concurrency.
4. Footprint: gateway process RSS and import time vs a process that imports TensorFlow.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from PIL import Image

from gateway.devrun import MODELS, wait_available
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tensors import image_tensor, to_array
from serving import scenes

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = [
    ("grpc.max_send_message_length", 512 * 1024 * 1024),
    ("grpc.max_receive_message_length", 512 * 1024 * 1024),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bench_encoding() -> list[str]:
    pixels = np.random.default_rng(0).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    content = image_tensor(pixels)
    typed = tfs.TensorProto(dtype=tfs.DT_UINT8, tensor_shape=content.tensor_shape)
    t_content = best_of(lambda: image_tensor(pixels).SerializeToString())
    t_typed = best_of(
        lambda: tfs.TensorProto(
            dtype=tfs.DT_UINT8, tensor_shape=content.tensor_shape, int_val=pixels.ravel()
        ).SerializeToString(),
        repeat=3,
    )
    typed.int_val.extend(pixels.ravel())
    size_content, size_typed = len(content.SerializeToString()), len(typed.SerializeToString())

    boxes = np.random.default_rng(1).random((1, 100, 4), dtype=np.float32)
    as_floats = tfs.TensorProto(dtype=tfs.DT_FLOAT, float_val=boxes.ravel())
    as_floats.tensor_shape.CopyFrom(image_tensor(np.zeros((100, 4, 3), np.uint8)).tensor_shape)
    del as_floats.tensor_shape.dim[-1]
    as_bytes = tfs.TensorProto(dtype=tfs.DT_FLOAT, tensor_content=boxes.tobytes())
    as_bytes.tensor_shape.CopyFrom(as_floats.tensor_shape)
    wire_f, wire_b = as_floats.SerializeToString(), as_bytes.SerializeToString()
    t_read_f = best_of(lambda: to_array(tfs.TensorProto.FromString(wire_f)), 50)
    t_read_b = best_of(lambda: to_array(tfs.TensorProto.FromString(wire_b)), 50)
    return [
        "| what | time | bytes on the wire |",
        "|---|---|---|",
        f"| 1080p uint8 image as tensor_content (gateway) | {t_content * 1e3:.2f} ms "
        f"| {size_content:,} |",
        f"| 1080p uint8 image as int_val | {t_typed * 1e3:.1f} ms ({t_typed / t_content:.0f}x) "
        f"| {size_typed:,} ({size_typed / size_content:.2f}x) |",
        f"| read detection_boxes [1,100,4] from float_val | {t_read_f * 1e6:.0f} µs "
        f"| {len(wire_f):,} |",
        f"| read detection_boxes [1,100,4] from tensor_content | {t_read_b * 1e6:.0f} µs "
        f"| {len(wire_b):,} |",
    ]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def bench_latency(gateway: str, serving: str, n: int) -> tuple[list[str], bytes]:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    scene = scenes.generate_scene(np.random.default_rng(3), 640, 480, 8, noise_sigma=6)
    jpeg = scenes.encode(scene.pixels, "JPEG")
    rows = [
        "| path (direct = official TF Serving client, decoding the JPEG itself) | model "
        "| p50 | p95 | mean |",
        "|---|---|---|---|---|",
    ]
    direct_channel = grpc.insecure_channel(serving, options=OPTIONS)
    direct = prediction_service_pb2_grpc.PredictionServiceStub(direct_channel)
    gw_channel = grpc.insecure_channel(gateway, options=OPTIONS)
    gw = pb_grpc.DetectionServiceStub(gw_channel)

    def direct_call(model: str) -> None:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        if model == "detector":
            pixels = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))[None]
            request.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto(pixels))
        else:
            request.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto([jpeg]))
        request.output_filter.extend(
            ["detection_boxes", "detection_scores", "detection_classes", "num_detections"]
        )
        direct.Predict(request, timeout=60)

    def gateway_call(model: str) -> None:
        gw.Detect(pb.DetectRequest(image=jpeg, model=pb.ModelSpec(name=model)), timeout=60)

    # Calls alternate between the two paths so both see the same machine noise; the paired
    # differences give the gateway's cost.
    for model in MODELS:
        for _ in range(5):  # warm up both paths
            direct_call(model)
            gateway_call(model)
        times: dict[str, list[float]] = {"direct": [], "gateway": []}
        for _ in range(n):
            for label, call in (("direct", direct_call), ("gateway", gateway_call)):
                started = time.perf_counter()
                call(model)
                times[label].append((time.perf_counter() - started) * 1e3)
        extra = [g - d for g, d in zip(times["gateway"], times["direct"], strict=True)]
        for label, values in times.items():
            rows.append(
                f"| {label} | {model} | {percentile(values, 50):.1f} ms | "
                f"{percentile(values, 95):.1f} ms | {statistics.mean(values):.1f} ms |"
            )
        rows.append(
            f"| gateway minus direct (paired) | {model} | {percentile(extra, 50):+.1f} ms | "
            f"{percentile(extra, 95):+.1f} ms | {statistics.mean(extra):+.1f} ms |"
        )
    direct_channel.close()
    gw_channel.close()
    return rows, jpeg


def _throughput(gateway: str, jpeg: bytes, model: str, concurrency: int, seconds: float):
    """Images per second and error count with `concurrency` clients for `seconds`."""
    counts = {"done": 0, "errors": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    request = pb.DetectRequest(image=jpeg, model=pb.ModelSpec(name=model))

    def worker() -> None:
        with grpc.insecure_channel(gateway, options=OPTIONS) as channel:
            stub = pb_grpc.DetectionServiceStub(channel)
            while time.monotonic() < stop:
                try:
                    stub.Detect(request, timeout=60)
                    outcome = "done"
                except grpc.RpcError:
                    outcome = "errors"
                with lock:
                    counts[outcome] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts["done"] / (time.monotonic() - started), counts["errors"]


def bench_throughput(gateway: str, jpeg: bytes, concurrency: int, seconds: float) -> list[str]:
    rows = ["| model | concurrency | images/s | errors |", "|---|---|---|---|"]
    for model in MODELS:
        rate, errors = _throughput(gateway, jpeg, model, concurrency, seconds)
        rows.append(f"| {model} | {concurrency} | {rate:.1f} | {errors} |")
    return rows


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def import_cost(module: str) -> tuple[float, float]:
    # VmHWM (peak RSS of this process image); ru_maxrss would carry over the parent's peak.
    code = (
        "import time; t = time.perf_counter(); "
        f"import {module}; "
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]; "
        "print(time.perf_counter() - t, hwm)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    return float(out[0]), int(out[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the benchmarks; write bench/RESULTS.md.")
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--requests", type=int, default=60, help="sequential requests per case")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    args = parser.parse_args()

    serving_port, gateway_port = free_port(), free_port()
    env = {**os.environ, "TFS_LOCAL_BIND_HOST": "127.0.0.1"}
    label_maps = ",".join(
        f"{m}={args.models / m / '1/assets.extra/label_map.pbtxt'}" for m in MODELS
    )
    config = args.models / "bench.models.config"
    config.write_text(
        "model_config_list {"
        + "".join(
            f" config {{ name: '{m}' base_path: '{(args.models / m).resolve()}' "
            "model_platform: 'tensorflow' }"
            for m in MODELS
        )
        + " }\n"
    )
    serving = subprocess.Popen(
        [sys.executable, "-m", "serving.local", f"--port={serving_port}",
         f"--model_config_file={config}"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    gateway = None
    try:
        wait_available(f"127.0.0.1:{serving_port}", MODELS[0], serving, timeout=300)
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={gateway_port}",
             f"--upstream=127.0.0.1:{serving_port}", f"--label-maps={label_maps}",
             "--metrics-port=0", "--log-level=WARNING"],
            cwd=ROOT,
        )  # fmt: skip
        time.sleep(2)
        target = f"127.0.0.1:{gateway_port}"
        print("encoding ...", flush=True)
        encoding = bench_encoding()
        print("latency ...", flush=True)
        latency, jpeg = bench_latency(target, f"127.0.0.1:{serving_port}", args.requests)
        print("throughput ...", flush=True)
        throughput = bench_throughput(target, jpeg, args.concurrency, args.seconds)
        gateway_rss, serving_rss = rss_mib(gateway.pid), rss_mib(serving.pid)
    finally:
        for process in (gateway, serving):
            if process is not None:
                process.terminate()
                process.wait(60)
    gw_import, gw_import_rss = import_cost("gateway.server")
    tf_import, tf_import_rss = import_cost("tensorflow")
    footprint = [
        "| what | value |",
        "|---|---|",
        f"| gateway RSS after the runs above | {gateway_rss:.0f} MiB |",
        f"| local TF Serving RSS (both models loaded) | {serving_rss:.0f} MiB |",
        f"| `import gateway.server`: time, peak RSS | {gw_import:.2f} s, {gw_import_rss:.0f} MiB |",
        f"| `import tensorflow`: time, peak RSS | {tf_import:.2f} s, {tf_import_rss:.0f} MiB |",
    ]
    report = "\n".join(
        [
            "# Benchmark results",
            "",
            f"Written by `make bench` on {time.strftime('%Y-%m-%d')}; {os.cpu_count()} cores, "
            f"{platform.processor() or platform.machine()}, Python {platform.python_version()}. "
            "Upstream is the local TF Serving-compatible server on loopback.",
            "",
            "## Tensor encoding",
            *encoding,
            "",
            f"## Latency (640x480 JPEG with 8 rectangles, {args.requests} sequential requests)",
            *latency,
            "",
            f"## Throughput ({args.seconds:.0f} s per model)",
            *throughput,
            "",
            "## Footprint",
            *footprint,
            "",
        ]
    )
    args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
