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
import base64
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import simplejpeg
from google.protobuf import json_format

from bench import load, photos, results
from bench import upstream as bench_upstream
from bench.__main__ import (
    RESULTS,
    ROOT,
    free_port,
    load_average,
    machine,
    predict_body,
    spread,
    upstream,
    verdict,
)
from bench.peers import odapi, venvs
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import PREDICT

MLSERVER_INFER = "/inference.GRPCInferenceService/ModelInfer"
JSON = ("content-type: application/json",)
GRPC = ("content-type: application/grpc", "te: trailers")
# Targets (issue 30), judged on concurrency 16 in pixel mode.
CPU_RATIO_TARGET = 0.33  # gateway CPU per request / the best peer's
RATE_RATIO_TARGET = 2.0  # gateway requests/s / the best peer's
FLOOR_RATIO_TARGET = 1.5  # gateway CPU per request, 1920x1080 / its decode alone


@dataclass(frozen=True)
class Scale:
    runs: int
    seconds: float  # of measured load per (server, image, concurrency)
    warmup: float
    images: tuple[str, ...]
    concurrency: tuple[int, ...] = (1, 16)
    # Servers started one at a time (start to ready measured alone), or all at once.
    start_alone: bool = True
    requests: int | None = None  # per figure instead of `seconds` (and no warm-up)


FULL = Scale(runs=3, seconds=5.0, warmup=1.0, images=("JPEG 640x480", "JPEG 1920x1080"))
QUICK = Scale(
    runs=1, seconds=0.0, warmup=0.0, images=("JPEG 640x480",), start_alone=False, requests=32
)


# --- processes ------------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float

    def tree(self) -> list[int]:
        """The process and all its descendants (MLServer's worker, its resource tracker)."""
        found, todo = [], [self.popen.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with suppress(OSError):
                    todo += [int(c) for c in (task / "children").read_text().split()]
        return found

    def cpu_seconds(self) -> float:
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.tree():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / ticks

    def rss_mib(self) -> float:
        total = 0
        for pid in self.tree():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{tail}")


@contextmanager
def process(name: str, command: Sequence[str], tmp: Path, **env: str) -> Iterator[Process]:
    """A server in its own session (stopped as a group: MLServer's worker goes with it),
    its output in a log shown when it fails."""
    log = tmp / f"{name.replace(' ', '-')}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
    try:
        yield Process(name, popen, log, time.perf_counter())
    finally:
        _stop_group(popen)


def _stop_group(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        os.killpg(popen.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            popen.wait(30)
    with suppress(ProcessLookupError):  # whatever of the group is left (a worker, a tracker)
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()


# --- answers --------------------------------------------------------------------------------

Answer = dict[str, Any]


def expected(width: int, height: int) -> Answer:
    """What every server must answer for an image of that size: the bench upstream's fixed
    outputs through the same mapping (min_score 0.5, pixel edges rounded half up)."""
    response = tfs.PredictResponse.FromString(bench_upstream.predict_response(odapi.MODEL))
    return {
        "detections": odapi.detections(response, width, height),
        "image_width": width,
        "image_height": height,
    }


def same(answer: Answer, want: Answer) -> bool:
    def key(a: Answer) -> list[tuple[Any, ...]]:
        return [
            (d["class_id"], d["label"], tuple(d["box"][k] for k in sorted(d["box"])))
            for d in a["detections"]
        ]

    scores_match = all(
        abs(a["score"] - b["score"]) < 1e-6
        for a, b in zip(answer["detections"], want["detections"], strict=False)
    )
    return (
        key(answer) == key(want)
        and scores_match
        and (answer["image_width"], answer["image_height"]) == (want["image_width"],
                                                                want["image_height"])
    )  # fmt: skip


def _detect_answer(result: pb.DetectionResult) -> Answer:
    data = json_format.MessageToDict(
        result, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _typed(data)


def _typed(data: dict[str, Any]) -> Answer:
    return {
        "detections": [
            {k: d[k] for k in ("class_id", "label", "score", "box")} for d in data["detections"]
        ],
        "image_width": data["image_width"],
        "image_height": data["image_height"],
    }


def _post_json(url: str, body: bytes) -> Any:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _mlserver_rest_answer(data: dict[str, Any]) -> Answer:
    outputs = {o["name"]: o["data"] for o in data["outputs"]}
    boxes = outputs["boxes"]
    return {
        "detections": [
            {
                "class_id": class_id,
                "label": label,
                "score": score,
                "box": dict(
                    zip(("x_min", "y_min", "x_max", "y_max"), boxes[4 * i : 4 * i + 4], strict=True)
                ),
            }
            for i, (class_id, label, score) in enumerate(
                zip(outputs["class_ids"], outputs["labels"], outputs["scores"], strict=True)
            )
        ],
        "image_width": outputs["image_size"][0],
        "image_height": outputs["image_size"][1],
    }


# --- servers --------------------------------------------------------------------------------


@dataclass
class Door:
    """One server's door: how load reaches it and how one answer is read back."""

    server: str  # the process it belongs to
    label: str
    url: str  # h2load target
    bodies: dict[str, bytes]  # per image: what h2load sends
    headers: tuple[str, ...]
    http1: bool
    probe: Callable[[str], Answer]  # image name -> the answer
    proxy: bool = False
    ping: Callable[[str], object] | None = None  # a cheaper call than probe, for readiness


@dataclass
class Images:
    data: dict[str, bytes]
    files: dict[str, Path]
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)


def _grpc_probe(target: str, body: bytes) -> Answer:
    with grpc.insecure_channel(target, options=load.CHANNEL_OPTIONS) as channel:
        raw = channel.unary_unary(load.DETECT)(body, timeout=60)
    return _detect_answer(pb.DetectionResult.FromString(raw))


def _mlserver(*args: str) -> str:
    """bench.peers.mlserver_tool in MLServer's venv (no TensorFlow: quick)."""
    run = subprocess.run(
        [_venv_python("mlserver"), "-m", "bench.peers.mlserver_tool",
         *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"mlserver_tool {args[0]} failed:\n{run.stderr[-3000:]}")
    return run.stdout


def _venv_python(name: str) -> str:
    return str(venvs.python(name))


@dataclass
class Server:
    name: str
    process: Process
    doors: list[Door]
    ready_after: float = float("nan")
    idle_rss: float = float("nan")
    load_rss: float = 0.0


def _wait_ready(server: Server, images: Images, timeout: float = 300) -> None:
    """Until every door of the server answers the smallest image (ready_after: start to the
    last door's first answer), then checks that each answer is the right one."""
    if server.ready_after == server.ready_after:  # not NaN: ready already
        return
    name = next(iter(images.data))
    deadline = time.monotonic() + timeout
    for door in server.doors:
        while True:
            server.process.check_alive()
            try:
                (door.ping or door.probe)(name)
                break
            except (grpc.RpcError, OSError, RuntimeError, KeyError, ValueError):
                if time.monotonic() > deadline:
                    tail = server.process.log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(
                        f"{door.label} did not answer within {timeout:.0f} s; its log ends:\n{tail}"
                    ) from None
                time.sleep(0.05)
    server.ready_after = time.perf_counter() - server.process.started
    check_answers(server, images, name)


def check_answers(server: Server, images: Images, name: str) -> None:
    want = expected(*images.sizes[name])
    for door in server.doors:
        answer = door.probe(name)
        if not same(answer, want):
            raise RuntimeError(f"{door.label} answered {answer} for {name}, expected {want}")


def gateway(stack: ExitStack, up: str, images: Images, tmp: Path) -> Server:
    port, http_port = free_port(), free_port()
    proc = stack.enter_context(
        process(
            "gateway",
            [sys.executable, "-m", "gateway", "--host=127.0.0.1", f"--port={port}",
             f"--http-port={http_port}", f"--upstream={up}", f"--model={odapi.MODEL}",
             "--metrics-port=0"],
            tmp,
        )
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    grpc_bodies = {
        n: pb.DetectRequest(image=d, model=pb.ModelSpec(name=odapi.MODEL)).SerializeToString()
        for n, d in images.data.items()
    }
    http_bodies = {
        n: json.dumps({"image": base64.b64encode(d).decode()}).encode()
        for n, d in images.data.items()
    }
    http_url = f"http://127.0.0.1:{http_port}/v1/models/{odapi.MODEL}:detect"
    doors = [
        Door("gateway", "gateway gRPC", f"http://{target}{load.DETECT}", grpc_bodies, GRPC,
             False, lambda n: _grpc_probe(target, grpc_bodies[n])),
        Door("gateway", "gateway HTTP", http_url, http_bodies, JSON, True,
             lambda n: _typed(_post_json(http_url, http_bodies[n]))),
    ]  # fmt: skip
    return Server("gateway", proc, doors)


def seed002(stack: ExitStack, up: str, images: Images, tmp: Path) -> Server:
    port = free_port()
    proc = stack.enter_context(
        process("seed 002", [sys.executable, "-m", "bench.peers.seed002", f"--port={port}",
                             f"--upstream={up}"], tmp)
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    bodies = {n: pb.DetectRequest(image=d).SerializeToString() for n, d in images.data.items()}
    door = Door("seed 002", "seed 002 gRPC", f"http://{target}{load.DETECT}", bodies, GRPC,
                False, lambda n: _grpc_probe(target, bodies[n]))  # fmt: skip
    return Server("seed 002", proc, [door])


def kserve(stack: ExitStack, up: str, images: Images, tmp: Path) -> Server:
    port = free_port()
    proc = stack.enter_context(
        process(
            "KServe",
            [_venv_python("kserve"), "-m", "bench.peers.kserve_transformer",
             f"--model_name={odapi.MODEL}", f"--http_port={port}", f"--grpc_port={free_port()}",
             f"--predictor_host={up}"],
            tmp,
        )
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1/models/{odapi.MODEL}:predict"
    bodies = {
        n: json.dumps({"instances": [{"image": {"b64": base64.b64encode(d).decode()}}]}).encode()
        for n, d in images.data.items()
    }
    door = Door("KServe", "KServe REST", url, bodies, JSON, True,
                lambda n: _typed(_post_json(url, bodies[n])["predictions"][0]))  # fmt: skip
    return Server("KServe", proc, [door])


def mlserver(stack: ExitStack, up: str, images: Images, tmp: Path) -> Server:
    http_port, grpc_port = free_port(), free_port()
    folder = tmp / "mlserver"
    folder.mkdir(exist_ok=True)
    proc = stack.enter_context(
        process(
            "MLServer",
            [_venv_python("mlserver"), "-m", "bench.peers.mlserver_tool", "serve",
             f"--folder={folder}", f"--http-port={http_port}", f"--grpc-port={grpc_port}",
             f"--metrics-port={free_port()}", f"--upstream={up}"],
            tmp,
        )
    )  # fmt: skip
    target = f"127.0.0.1:{grpc_port}"
    grpc_bodies = {}
    for name, path in images.files.items():
        out = tmp / f"oip-{path.stem}.bin"
        _mlserver("body", str(path), str(out))
        grpc_bodies[name] = out.read_bytes()
    url = f"http://127.0.0.1:{http_port}/v2/models/{odapi.MODEL}/infer"
    rest_bodies = {
        n: json.dumps(
            {
                "inputs": [
                    {
                        "name": "image",
                        "datatype": "BYTES",
                        "shape": [1],
                        "parameters": {"content_type": "base64"},
                        "data": [base64.b64encode(d).decode()],
                    }
                ]
            }
        ).encode()
        for n, d in images.data.items()
    }

    def grpc_probe(name: str) -> Answer:  # in MLServer's venv, which has the OIP messages
        return json.loads(_mlserver("probe", target, str(images.files[name])))

    def grpc_ping(name: str) -> object:  # any answer with status OK
        with grpc.insecure_channel(target, options=load.CHANNEL_OPTIONS) as channel:
            return channel.unary_unary(MLSERVER_INFER)(grpc_bodies[name], timeout=60)

    doors = [
        Door("MLServer", "MLServer REST", url, rest_bodies, JSON, True,
             lambda n: _mlserver_rest_answer(_post_json(url, rest_bodies[n]))),
        Door("MLServer", "MLServer gRPC", f"http://{target}{MLSERVER_INFER}", grpc_bodies, GRPC,
             False, grpc_probe, ping=grpc_ping),
    ]  # fmt: skip
    return Server("MLServer", proc, doors)


@contextmanager
def proxies(up: str, image: str, data: bytes, tmp: Path) -> Iterator[list[Server]]:
    """The like-for-like do-nothing proxies for one image: gRPC and HTTP, each forwarding
    the gateway's pixel PredictRequest for it."""
    send = tmp / "send.bin"
    send.write_bytes(predict_body(data, "pixel"))
    grpc_port, http_port = free_port(), free_port()
    detect = pb.DetectRequest(image=data, model=pb.ModelSpec(name=odapi.MODEL)).SerializeToString()
    http_body = json.dumps({"image": base64.b64encode(data).decode()}).encode()
    common = [sys.executable, "-m", "bench.proxy", f"--upstream={up}", f"--send={send}"]
    with (
        process("proxy gRPC", [*common, f"--port={grpc_port}"], tmp) as grpc_proxy,
        process("proxy HTTP", [*common, f"--port={http_port}", "--http"], tmp) as http_proxy,
    ):
        target = f"127.0.0.1:{grpc_port}"
        http_url = f"http://127.0.0.1:{http_port}/v1/models/{odapi.MODEL}:detect"

        def answers(_: str) -> Answer:  # it answers, with a fixed result (not checked)
            return expected(*_size(data))

        servers = [
            Server("proxy gRPC", grpc_proxy, [Door(
                "proxy gRPC", "do-nothing proxy gRPC", f"http://{target}{PREDICT}",
                {image: detect}, GRPC, False, answers, proxy=True)]),
            Server("proxy HTTP", http_proxy, [Door(
                "proxy HTTP", "do-nothing proxy HTTP", http_url, {image: http_body}, JSON, True,
                answers, proxy=True)]),
        ]  # fmt: skip
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        deadline = time.monotonic() + 60
        while True:
            http_proxy.check_alive()
            try:
                _post_json(http_url, http_body)
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError("the HTTP proxy did not start") from None
                time.sleep(0.05)
        yield servers


def _pixels(name: str) -> tuple[int, int]:
    """ "JPEG 640x480" -> (640, 480)."""
    width, height = name.split()[1].split("x")
    return int(width), int(height)


def _size(data: bytes) -> tuple[int, int]:
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return int(width), int(height)


# --- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    rate: float  # requests/s (h2load, measured window)
    p50: float
    p99: float
    cpu_us: float  # CPU of the serving tree per request that reached the upstream
    errors: int


def measure(up: str, server: Server, door: Door, image: str, concurrency: int,
            scale: Scale) -> Measure:  # fmt: skip
    def sample() -> None:
        server.load_rss = max(server.load_rss, server.process.rss_mib())

    server.process.check_alive()
    cpu_before, (calls_before, _) = server.process.cpu_seconds(), bench_upstream.stats(up)
    body = door.bodies[image]
    if not door.http1:  # gRPC: one length-prefixed message frame
        body = b"\x00" + len(body).to_bytes(4, "big") + body
    result = load.h2load(door.url, body, concurrency, scale.seconds, scale.warmup, door.headers,
                         door.http1, during=sample, requests=scale.requests)  # fmt: skip
    cpu = server.process.cpu_seconds() - cpu_before
    calls = bench_upstream.stats(up)[0] - calls_before
    server.process.check_alive()
    return Measure(result.rate, result.p(50), result.p(99), cpu / max(calls, 1) * 1e6,
                   result.errors)  # fmt: skip


def decode_floor(images: Images, repeat: int = 30) -> dict[str, float]:
    """µs of CPU (this thread) per libjpeg-turbo decode of each image, alone: the least any
    server in pixel mode spends per request."""
    floors = {}
    for name, data in images.data.items():
        simplejpeg.decode_jpeg(data, colorspace="RGB")
        times = []
        for _ in range(repeat):
            started = time.thread_time()
            simplejpeg.decode_jpeg(data, colorspace="RGB")
            times.append(time.thread_time() - started)
        floors[name] = statistics.median(times) * 1e6
    return floors


Key = tuple[str, str, int]  # door label, image, concurrency


@dataclass
class Run:
    measures: dict[Key, Measure] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    idle_rss: dict[str, float] = field(default_factory=dict)
    load_rss: dict[str, float] = field(default_factory=dict)
    floor: dict[str, float] = field(default_factory=dict)


def one_run(up: str, images: Images, scale: Scale, number: int) -> Run:
    run = Run(floor=decode_floor(images))
    with tempfile.TemporaryDirectory() as name, ExitStack() as stack:
        tmp = Path(name)
        servers = []
        for start in (gateway, seed002, kserve, mlserver):
            servers.append(start(stack, up, images, tmp))
            if scale.start_alone:
                _wait_ready(servers[-1], images)
        for server in servers:
            _wait_ready(server, images)  # at once when not started alone
        time.sleep(1.0)  # settle: nothing in flight
        for server in servers:
            run.ready[server.name] = server.ready_after
            run.idle_rss[server.name] = server.process.rss_mib()
        for image, data in images.data.items():
            for server in servers:
                check_answers(server, images, image)
            with proxies(up, image, data, tmp) as proxied:
                everyone = servers + proxied
                # Rotated each run, so a slow spell of the machine lands on another server.
                shift = number % len(everyone)
                everyone = everyone[shift:] + everyone[:shift]
                for concurrency in scale.concurrency:
                    for server in everyone:
                        for door in server.doors:
                            key = (door.label, image, concurrency)
                            run.measures[key] = measure(up, server, door, image, concurrency,
                                                        scale)  # fmt: skip
                            print(f"  run {number + 1} {key}: {run.measures[key]}", flush=True)
        for server in servers:
            run.load_rss[server.name] = server.load_rss
    return run


# --- report ---------------------------------------------------------------------------------

GRPC_DOORS = ("gateway gRPC", "seed 002 gRPC", "MLServer gRPC")
HTTP_DOORS = ("gateway HTTP", "KServe REST", "MLServer REST")
PROXY = {"gRPC": "do-nothing proxy gRPC", "HTTP": "do-nothing proxy HTTP"}
SERVER_OF = {
    "gateway gRPC": "gateway",
    "gateway HTTP": "gateway",
    "seed 002 gRPC": "seed 002",
    "KServe REST": "KServe",
    "MLServer REST": "MLServer",
    "MLServer gRPC": "MLServer",
}


def _values(runs: list[Run], key: Key, what: str) -> list[float]:
    return [getattr(r.measures[key], what) for r in runs if key in r.measures]


def _own(runs: list[Run], door: str, image: str, concurrency: int) -> list[float]:
    """The gateway's own µs per request: its CPU per request minus the like-for-like
    do-nothing proxy's, run by run."""
    kind = "gRPC" if door == "gateway gRPC" else "HTTP"
    return [
        r.measures[(door, image, concurrency)].cpu_us
        - r.measures[(PROXY[kind], image, concurrency)].cpu_us
        for r in runs
    ]


def door_tables(runs: list[Run], scale: Scale, kind: str, doors: tuple[str, ...]) -> list[str]:
    ours, peers = doors[0], doors[1:]
    c1, c16 = scale.concurrency[0], scale.concurrency[-1]
    lines = [
        f"| image | server | requests/s, c{c1} | p50 / p99, c{c1} | requests/s, c{c16} "
        f"| p50 / p99, c{c16} | CPU µs per request, c{c1} | CPU µs per request, c{c16} "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for image in scale.images:
        for door in (*doors, PROXY[kind]):
            cells = []
            for c in (c1, c16):
                key = (door, image, c)
                cells.append(spread(_values(runs, key, "rate"), "{:.0f}"))
                cells.append(
                    f"{spread(_values(runs, key, 'p50'))} / {spread(_values(runs, key, 'p99'))} ms"
                )
            cpu = [spread(_values(runs, (door, image, c), "cpu_us"), "{:,.0f}") for c in (c1, c16)]
            errors = sum(sum(_values(runs, (door, image, c), "errors")) for c in (c1, c16))
            lines.append(
                f"| {image} | {door} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} "
                f"| {cpu[0]} | {cpu[1]} | {errors:.0f} |"
            )
    lines += [
        "",
        f"Ratios, gateway / peer, run by run (the gateway's own µs per request over the "
        f"do-nothing {kind} proxy in the same runs beside each):",
        "",
        f"| image | peer | CPU per request, c{c16} | requests/s, c{c16} | CPU per request, c{c1} "
        f"| requests/s, c{c1} | gateway's own µs per request, c{c1} / c{c16} |",
        "|---|---|---|---|---|---|---|",
    ]
    for image in scale.images:
        own = (
            f"{spread(_own(runs, ours, image, c1), '{:,.0f}')} / "
            f"{spread(_own(runs, ours, image, c16), '{:,.0f}')}"
        )
        for peer in peers:
            cells = []
            for c in (c16, c1):
                for what in ("cpu_us", "rate"):
                    mine = _values(runs, (ours, image, c), what)
                    theirs = _values(runs, (peer, image, c), what)
                    ratios = [
                        m / t if t else float("nan") for m, t in zip(mine, theirs, strict=True)
                    ]
                    cells.append(spread(ratios, "{:.2f}x"))
            lines.append(f"| {image} | {peer} | {' | '.join(cells)} | {own} |")
    return lines


def footprint(runs: list[Run]) -> list[str]:
    lines = [
        "| server | start to first correct answer | RSS idle | RSS under load (most seen) |",
        "|---|---|---|---|",
    ]
    for name in ("gateway", "seed 002", "KServe", "MLServer"):
        ready = [r.ready[name] for r in runs]
        idle = [r.idle_rss[name] for r in runs]
        most = [r.load_rss[name] for r in runs]
        lines.append(
            f"| {name} | {spread(ready)} s | {spread(idle, '{:.0f}')} MiB "
            f"| {spread(most, '{:.0f}')} MiB |"
        )
    return lines


def targets(runs: list[Run], scale: Scale) -> list[str]:
    c16 = scale.concurrency[-1]
    lines = ["| target | measured | |", "|---|---|---|"]
    for kind, doors in (("gRPC", GRPC_DOORS), ("HTTP", HTTP_DOORS)):
        ours, peers = doors[0], doors[1:]
        for image in scale.images:
            cpu_ratios, rate_ratios, best_cpu, best_rate = [], [], [], []
            for r in runs:
                peer_cpu = {p: r.measures[(p, image, c16)].cpu_us for p in peers}
                peer_rate = {p: r.measures[(p, image, c16)].rate for p in peers}
                cheapest = min(peer_cpu, key=peer_cpu.__getitem__)
                fastest = max(peer_rate, key=peer_rate.__getitem__)
                best_cpu.append(cheapest)
                best_rate.append(fastest)
                cpu_ratios.append(r.measures[(ours, image, c16)].cpu_us / peer_cpu[cheapest])
                rate_ratios.append(r.measures[(ours, image, c16)].rate / peer_rate[fastest])
            own = spread(_own(runs, ours, image, c16), "{:,.0f}")
            lines.append(
                f"| {kind} door, {image}, c{c16}: CPU per request <= {CPU_RATIO_TARGET}x the best "
                f"peer's | {spread(cpu_ratios, '{:.2f}x')} of {_names(best_cpu)} (gateway's own: "
                f"{own} µs per request) | {verdict(cpu_ratios, lambda v: v <= CPU_RATIO_TARGET)} |"
            )
            lines.append(
                f"| {kind} door, {image}, c{c16}: requests/s >= {RATE_RATIO_TARGET:g}x the best "
                f"peer's | {spread(rate_ratios, '{:.2f}x')} of {_names(best_rate)} (gateway's "
                f"own: {own} µs per request) "
                f"| {verdict(rate_ratios, lambda v: v >= RATE_RATIO_TARGET)} |"
            )
    big = "JPEG 1920x1080"
    if big in scale.images:
        for door in ("gateway gRPC", "gateway HTTP"):
            ratios = [r.measures[(door, big, c16)].cpu_us / r.floor[big] for r in runs]
            floors = spread([r.floor[big] for r in runs], "{:,.0f}")
            lines.append(
                f"| {door}, {big}, c{c16}: CPU per request <= {FLOOR_RATIO_TARGET}x the decode "
                f"floor ({floors} µs) | {spread(ratios, '{:.2f}x')} "
                f"| {verdict(ratios, lambda v: v <= FLOOR_RATIO_TARGET)} |"
            )
    return lines


def _names(names: list[str]) -> str:
    return " / ".join(dict.fromkeys(names))


def report(runs: list[Run], scale: Scale, started: float, load_before: str) -> str:
    amount = (
        f"{scale.seconds:g} s after {scale.warmup:g} s of warm-up"
        if scale.requests is None
        else f"{scale.requests} requests"
    )
    floors = "; ".join(
        f"{image} {spread([r.floor[image] for r in runs], '{:,.0f}')} µs" for image in scale.images
    )
    return "\n".join(
        [
            "## Against what users would pick instead (bench/peers)",
            "",
            f"`python -m bench.peers` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{time.monotonic() - started:.0f} s: {machine()}. Load average {load_before} "
            f"before, {load_average()} after. Pixel mode (every server decodes the JPEG and "
            f"sends uint8 pixels to bench/upstream.py), h2load for {amount} per figure (HTTP/2 for "
            "gRPC, HTTP/1.1 keep-alive for HTTP; c = connections, one request in flight on "
            f"each); {scale.runs} runs, each starting every process anew, given as "
            '"median (min to max)". CPU per request: user + system seconds of the serving '
            "process and its children (MLServer's inference worker) over the requests that "
            "reached the upstream. Every server's answer (boxes in pixels, labels, scores) "
            "was checked against the bench upstream's outputs before it was measured.",
            "",
            "The peers (bench/peers/): seed 002's synchronous grpcio gateway (Pillow, "
            "`tf.make_tensor_proto`, the official stub, `np.array(float_val)`; 10 threads, "
            "as gRPC's examples); a KServe 0.21 custom transformer (`kserve.Model`, "
            "`kserve.ModelServer` with its defaults; `preprocess`/`postprocess` plain "
            "functions as its docs write them, `predict` calling TF Serving's gRPC Predict "
            "through the official stub on grpc.aio); an MLServer 1.7 custom runtime "
            "(`mlserver.MLModel`, MLServer's defaults: inference in one worker process; the "
            "same Predict call). The do-nothing proxies (bench/proxy.py, grpc.aio and "
            "aiohttp as the gateway's doors) receive what the gateway receives and forward "
            "its pixel request unread. Decode floor (libjpeg-turbo alone, CPU per decode, "
            f"same runs): {floors}.",
            "",
            "### Targets",
            "",
            *targets(runs, scale),
            "",
            "### gRPC door: Detect, seed 002's Detect, MLServer's ModelInfer (image as BYTES)",
            "",
            *door_tables(runs, scale, "gRPC", GRPC_DOORS),
            "",
            "### HTTP door: JSON with the image in base64 (gateway `:detect`, KServe v1 "
            "`:predict`, MLServer v2 `/infer`)",
            "",
            *door_tables(runs, scale, "HTTP", HTTP_DOORS),
            "",
            "### Footprint (the gateway serves both doors from one process; so does MLServer, "
            "with its worker)",
            "",
            *footprint(runs),
            "",
        ]
    )


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
    images.sizes = {name: _size(data) for name, data in images.data.items()}
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
