"""Where a string-mode request's CPU goes in the gateway: py-spy samples under load.

Starts the bench upstream and one gateway, loads it with h2load (640x480 JPEG, string mode,
concurrency 32) and samples the gateway with py-spy (pip install py-spy) meanwhile. Each
sample is one stack of one thread; the table gives, for the functions of the request path,
the share of all samples with that function on the stack ("inclusive"). Samples outside
any gateway frame are gRPC's own (its Cython event-loop callbacks, its poller thread) and
the event loop. Writes its section of bench/results.md.

    python -m bench.profile [--seconds 15]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import load, photos, results
from bench.calls import detect_body
from bench.host import load_average
from bench.processes import gateway, upstream
from bench.results import RESULTS

# (label, frame-name prefix) in the order of the request path.
PATH = [
    ("servicer: Detect (everything below)", "TaskServicer.unary "),
    ("pipeline: run", "Pipeline.run "),
    ("inputs: forward_encoded (header read, request bytes)", "forward_encoded "),
    ("  images: inspect_image (header read)", "inspect_image "),
    ("  wire: string_request", "string_request "),
    ("upstream client: predict (call + response checked)", "TFServingClient.predict "),
    ("  tensors: OutputTensor (each response tensor checked)", "OutputTensor.__init__ "),
    ("  tensors: OutputTensor.head (the rows a detector found)", "OutputTensor.head "),
    ("task: DetectionTask.map (outputs -> detections)", "DetectionTask.map "),
    ("api: Binding.to_result (-> protobuf)", "Binding.to_result "),
    ("pipeline: _record (metrics + request log)", "Pipeline._record "),
    ("  metrics: record", "record (gateway/metrics.py"),
    ("  logging: Logger.info (JSON line)", "Logger.info "),
    ("servicer: _metadata (trace headers)", "_metadata "),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    beside = Path(sys.executable).parent / "py-spy"  # installed into this virtualenv
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    body = detect_body(photos.load()["JPEG 640x480"], "encoded")
    before = load_average()
    with tempfile.TemporaryDirectory() as tmp, upstream() as up, gateway(up) as gw:
        raw = Path(tmp) / "samples.txt"
        load.closed_loop(gw.target, load.DETECT, body, 32, 2.0)  # warm-up
        sampler = subprocess.Popen(
            [spy, "record", "--pid", str(gw.process.pid), "--duration", str(round(args.seconds)),
             "--rate", "200", "--format", "raw", "--output", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)
        result = load.closed_loop(gw.target, load.DETECT, body, 32, args.seconds - 1.0)
        sampler.wait(timeout=args.seconds + 60)
        inclusive: collections.Counter[str] = collections.Counter()
        total = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            n = int(count)
            total += n
            frames = stack.split(";")
            for label, prefix in PATH:
                if any(f.startswith(prefix) for f in frames):
                    inclusive[label] += n
    lines = [
        "## 7. Profile: where the gateway's CPU goes, string mode",
        "",
        f"`python -m bench.profile` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        f"(load average {before} before): py-spy, 200 samples/s, {args.seconds:.0f} s of "
        f"h2load at concurrency 32 (640x480 JPEG, string mode, {result.rate:.0f} requests/s); "
        f"{total:,} samples. Share of all samples with the function on the stack:",
        "",
        "| function | share of samples |",
        "|---|---|",
    ]
    for label, _ in PATH:
        lines.append(f"| {label} | {inclusive[label] / total * 100:.1f} % |")
    outside = total - inclusive[PATH[0][0]]
    lines += [
        f"| outside the servicer (gRPC's Cython callbacks and poller thread, the event "
        f"loop, the metrics thread) | {outside / total * 100:.1f} % |",
    ]
    text = "\n".join(lines)
    results.write_section(args.out, "profile", text)
    print(text)


if __name__ == "__main__":
    main()
