"""The servers of one run and their doors: the gateway, seed 002's gateway, the KServe
transformer, the MLServer runtime and the like-for-like do-nothing proxies, each started on
OS-picked loopback ports in front of the bench upstream; how load reaches each door, and how
one answer is read back and checked."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import simplejpeg

from bench import load
from bench.calls import predict_body
from bench.peers import odapi, venvs
from bench.peers.answers import (
    Answer,
    expected,
    grpc_probe,
    mlserver_rest_answer,
    post_json,
    same,
    typed,
)
from bench.peers.processes import Process, process
from bench.processes import ROOT, free_port
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from gateway.upstream.client import PREDICT

MLSERVER_INFER = "/inference.GRPCInferenceService/ModelInfer"
JSON = ("content-type: application/json",)
GRPC = ("content-type: application/grpc", "te: trailers")


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


def wait_ready(server: Server, images: Images, timeout: float = 300) -> None:
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
        n: pb.DetectRequest(
            image=d, model=model_pb2.ModelSpec(name=odapi.MODEL)
        ).SerializeToString()
        for n, d in images.data.items()
    }
    http_bodies = {
        n: json.dumps({"image": base64.b64encode(d).decode()}).encode()
        for n, d in images.data.items()
    }
    http_url = f"http://127.0.0.1:{http_port}/v1/models/{odapi.MODEL}:detect"
    doors = [
        Door("gateway", "gateway gRPC", f"http://{target}{load.DETECT}", grpc_bodies, GRPC,
             False, lambda n: grpc_probe(target, grpc_bodies[n])),
        Door("gateway", "gateway HTTP", http_url, http_bodies, JSON, True,
             lambda n: typed(post_json(http_url, http_bodies[n]))),
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
                False, lambda n: grpc_probe(target, bodies[n]))  # fmt: skip
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
                lambda n: typed(post_json(url, bodies[n])["predictions"][0]))  # fmt: skip
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
             lambda n: mlserver_rest_answer(post_json(url, rest_bodies[n]))),
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
    detect = pb.DetectRequest(
        image=data, model=model_pb2.ModelSpec(name=odapi.MODEL)
    ).SerializeToString()
    http_body = json.dumps({"image": base64.b64encode(data).decode()}).encode()
    common = [sys.executable, "-m", "bench.proxy", f"--upstream={up}", f"--send={send}"]
    with (
        process("proxy gRPC", [*common, f"--port={grpc_port}"], tmp) as grpc_proxy,
        process("proxy HTTP", [*common, f"--port={http_port}", "--http"], tmp) as http_proxy,
    ):
        target = f"127.0.0.1:{grpc_port}"
        http_url = f"http://127.0.0.1:{http_port}/v1/models/{odapi.MODEL}:detect"

        def answers(_: str) -> Answer:  # it answers, with a fixed result (not checked)
            return expected(*jpeg_size(data))

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
                post_json(http_url, http_body)
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError("the HTTP proxy did not start") from None
                time.sleep(0.05)
        yield servers


def jpeg_size(data: bytes) -> tuple[int, int]:
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return int(width), int(height)
