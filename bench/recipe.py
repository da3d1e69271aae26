"""The client recipe and the gateway's request building in a fresh process, in a chosen glibc
allocator state.

glibc serves large allocations with mmap and, by default, raises its mmap threshold as a
process frees large blocks (the "dynamic threshold"). The recipe allocates several copies of
every image (PIL image, np.array, TensorProto, serialized request), so its time depends on
what the process did before: in a fresh process each copy is fresh mmap'd memory that
faults in page by page. `MALLOC_MMAP_THRESHOLD_=33554432` keeps blocks under 32 MiB on the
heap, where freed memory is reused without faults. Every figure is therefore measured in a
new process per allocator state:

- default: glibc as every process starts (the gateway process sets its own at startup,
  gateway/memory.py: 2 arenas, 32 MiB mmap and 64 MiB trim thresholds);
- tuned: MALLOC_MMAP_THRESHOLD_=33554432;
- tuned+trim: also MALLOC_TRIM_THRESHOLD_=268435456 (see STATES).

`python -m bench.recipe build` prints request-building medians as JSON (section 1);
`python -m bench.recipe e2e --upstream ... --gateway ...` prints end-to-end latencies of the
recipe calling the upstream directly and of the gateway, alternating call by call.
`python -m bench` runs both in each state (bench.sections.building, bench.sections.footprint).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATES: dict[str, dict[str, str]] = {
    "default": {},
    "tuned": {"MALLOC_MMAP_THRESHOLD_": "33554432"},
    # A fixed mmap threshold also fixes the trim threshold at 128 KiB, so freed blocks at
    # the top of the heap go back to the kernel and fault in again; this keeps them.
    "tuned+trim": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"},
}


def in_state(state: str, *args: str, timeout: float = 1800) -> Any:
    """Runs `python -m bench.recipe *args` in a new process in allocator `state`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env |= STATES[state]
    out = subprocess.run(
        [sys.executable, "-m", "bench.recipe", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"bench.recipe {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def _build(names: list[str], repeat: int, parts: tuple[str, ...]) -> dict[str, Any]:
    from bench import building, photos

    chosen = {k: v for k, v in photos.load().items() if k in names}
    rows, parse_us = building.run(chosen, repeat, parts)
    return {"rows": [asdict(r) for r in rows], "parse_us": parse_us}


def _e2e(upstream: str, gateway: str, name: str, calls: int) -> dict[str, Any]:
    """Recipe (build the request from the JPEG, Predict directly) vs the gateway (Detect with
    the JPEG), alternating call by call on one thread; milliseconds per call."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from bench import building, load, photos
    from gateway.proto.detection.v1 import detection_pb2 as pb
    from gateway.proto.vision.v1 import model_pb2
    from gateway.upstream.client import PREDICT

    data = photos.load()[name]
    direct = grpc.insecure_channel(upstream, options=load.CHANNEL_OPTIONS)
    through = grpc.insecure_channel(gateway, options=load.CHANNEL_OPTIONS)
    predict = direct.unary_unary(PREDICT)
    detect = through.unary_unary(load.DETECT)
    body = pb.DetectRequest(
        image=data, model=model_pb2.ModelSpec(name="pixels")
    ).SerializeToString()

    def recipe() -> None:
        predict(building.recipe_request(data, tf, predict_pb2), timeout=120)

    def gateway_call() -> None:
        detect(body, timeout=120)

    times: dict[str, list[float]] = {"recipe": [], "gateway": []}
    cases = {"recipe": recipe, "gateway": gateway_call}
    for case in cases.values():
        case()  # warm-up: imports, connections, the gateway's signature cache
    for _ in range(calls):
        for key, case in cases.items():
            started = time.perf_counter()
            case()
            times[key].append((time.perf_counter() - started) * 1e3)
    direct.close()
    through.close()
    return {k: {"median": statistics.median(v), "all": v} for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    build = sub.add_parser("build")
    build.add_argument("--images", required=True, help="comma-separated names from bench.photos")
    build.add_argument("--repeat", type=int, default=25)
    build.add_argument("--part", choices=("recipe", "gateway"), help="only this one")
    e2e = sub.add_parser("e2e")
    e2e.add_argument("--upstream", required=True)
    e2e.add_argument("--gateway", required=True)
    e2e.add_argument("--image", default="JPEG 4032x3024")
    e2e.add_argument("--calls", type=int, default=9)
    args = parser.parse_args()
    if args.what == "build":
        parts = (args.part,) if args.part else ("recipe", "gateway")
        result = _build(args.images.split(","), args.repeat, parts)
    else:
        result = _e2e(args.upstream, args.gateway, args.image, args.calls)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
