"""`make run`: the local TF Serving-compatible server and the gateway, side by side.

Starts `python -m serving.local` on the reference models, waits until they are AVAILABLE,
starts the gateway against it, writes two sample pictures, and prints ready-to-paste commands,
one per task (grpcurl, the client command, curl). Ctrl-C, SIGTERM or SIGHUP (to make or to
devrun) stops both, the gateway first, and devrun waits for them: nothing is left behind (see
Stopping for how a signal sent to make alone reaches it).

Development only: it imports serving.scenes (numpy + Pillow) for the sample image.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import GET_MODEL_STATUS
from serving import scenes

# The gateway's model config for the reference models (tasks, labels, input preparation).
MODEL_CONFIG = Path("serving/gateway-models.toml")
# The local server's model repository; its base paths are rewritten under --models.
SERVING_CONFIG = Path("serving/models.config")
NAMES = ("the local TF Serving server", "the gateway")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How often the waits look at the servers, the signals and the lease.
POLL_SECONDS = 0.2
# Each server gets this long to stop after SIGTERM (the gateway's grace is 30 s by default).
STOP_SECONDS = 40.0


class Stopping:
    """Why `make run` should stop, once it should: a signal, or make deleting the lease.

    make passes SIGTERM on to its recipe, and a terminal sends Ctrl-C's SIGINT to the whole
    process group; but SIGHUP (and SIGINT) sent to make alone reach only make, which then
    waits for its recipe. On every fatal signal make deletes the file the running recipe was
    updating (GNU make manual, "Interrupts"), the lease: devrun writes it as it starts and
    stops the servers when it is gone, so make can exit and leaves none behind.
    """

    def __init__(self, lease: Path | None) -> None:
        self.lease = lease
        self.signal: int | None = None
        if lease is not None:
            lease.parent.mkdir(parents=True, exist_ok=True)
            lease.write_text(f"{os.getpid()}\n")
        for sig in STOP_SIGNALS:
            # A signal the caller ignores (nohup ignores SIGHUP) stays ignored.
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signal = signum

    @property
    def why(self) -> str | None:
        if self.signal is not None:
            return signal.Signals(self.signal).name
        if self.lease is not None and not self.lease.exists():
            return f"make deleted {self.lease}"
        return None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.unlink(missing_ok=True)


class Stop(Exception):
    """Raised from a wait when `make run` is being stopped."""


def _start(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Starts a server in make's process group with SIGHUP ignored: a hangup of the terminal
    reaches devrun too, which stops the servers in order (gateway first) rather than both
    dying at once."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        return subprocess.Popen(command, env=env)
    finally:
        signal.signal(signal.SIGHUP, previous)


def _poll(process: subprocess.Popen[bytes], name: str, stopping: Stopping) -> None:
    if stopping.why is not None:
        raise Stop(stopping.why)
    if process.poll() is not None:
        raise SystemExit(f"{name} exited with {process.returncode}")


def wait_available(
    target: str,
    model: str,
    process: subprocess.Popen[bytes],
    stopping: Stopping,
    timeout: float,
) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        status = channel.unary_unary(
            GET_MODEL_STATUS,
            request_serializer=tfs.GetModelStatusRequest.SerializeToString,
            response_deserializer=tfs.GetModelStatusResponse.FromString,
        )
        while time.monotonic() < deadline:
            _poll(process, "the local TF Serving server", stopping)
            try:
                response = status(
                    tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name=model)), timeout=1
                )
                if any(
                    s.state == tfs.ModelVersionStatus.AVAILABLE
                    for s in response.model_version_status
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(POLL_SECONDS)
    raise SystemExit(f"model {model} did not become AVAILABLE within {timeout:.0f} s")


def _wait_serving(
    target: str, process: subprocess.Popen[bytes], stopping: Stopping, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    # The overall status (""): SERVING once the gateway serves its default model.
    request = health_pb2.HealthCheckRequest(service="")
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            _poll(process, "the gateway", stopping)
            try:
                if stub.Check(request, timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(POLL_SECONDS)
    raise SystemExit(f"the gateway did not become ready within {timeout:.0f} s")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each server, the gateway first (it drains its calls, then the upstream
    goes); SIGKILL to one still running after STOP_SECONDS."""
    for process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _samples(models: Path) -> dict[str, Path]:
    """Writes the sample pictures (once): rectangles for the detectors, classifiers and the
    embedder; one shape per colour for the segmenter and the keypoint model."""
    pictures = {
        "scene": scenes.sample_scene,
        "shapes": lambda: scenes.shapes_scene(noise_sigma=4.0),
    }
    paths = {}
    for name, make in pictures.items():
        path = paths[name] = models / "samples" / f"{name}.jpg"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(scenes.encode(make().pixels, "JPEG"))
    return paths


def _banner(args: argparse.Namespace, models: list[str], samples: dict[str, Path]) -> str:
    """The ports, the models and one command per task to paste (each after a comment line
    naming the task: pasted whole, the comments do nothing)."""
    grpcurl = Path(sys.executable).parent / "grpcurl"
    target = f"localhost:{args.gateway_port}"
    http = f"http://localhost:{args.http_port}"
    scene, shapes = samples["scene"], samples["shapes"]
    return f"""
ready:
  gateway (detection, classification, instance segmentation, keypoints, embedding and the
  pipeline detect_then_classify over gRPC)
                                            {target}
  models                                    {", ".join(models)}
  local TF Serving (gRPC)                   localhost:{args.serving_port}
  gateway HTTP door and page                {http}/
  gateway metrics                           http://localhost:{args.metrics_port}/metrics
  batch jobs                                open to anonymous callers, all as one tenant
  sample pictures                           {scene} (rectangles), {shapes} (shapes)

try:
  # detection (gRPC, grpcurl)
  {grpcurl} -plaintext -max-msg-sz 67108864 \\
    -d "{{\\"image\\": \\"$(base64 -w0 {scene})\\", \\"min_score\\": 0.5}}" \\
    {target} detection.v1.DetectionService/Detect

  # classification (the client command)
  {sys.executable} -m gateway.client {scene} --task classify --model classifier_logits \\
    --target {target}

  # instance segmentation (HTTP)
  curl -s -H 'Content-Type: image/jpeg' --data-binary @{shapes} \\
    '{http}/v1/models/maskrcnn:segment?mask_format=rle'

  # keypoints (gRPC, grpcurl)
  {grpcurl} -plaintext -max-msg-sz 67108864 -d "{{\\"image\\": \\"$(base64 -w0 {shapes})\\"}}" \\
    {target} keypoints.v1.KeypointService/DetectKeypoints

  # embedding (HTTP)
  curl -s -H 'Content-Type: image/jpeg' --data-binary @{scene} '{http}/v1/models/embedder:embed'

  # pipeline: detect, then classify each box's crop (HTTP)
  curl -s -H 'Content-Type: image/jpeg' --data-binary @{scene} \\
    '{http}/v1/pipelines/detect_then_classify:run'

  # or open {http}/ and drop a picture on the page

Ctrl-C stops both.
"""


def _serving_config(models: Path) -> Path:
    """serving/models.config with its base paths under `models` (the config names them
    relative to the repository root, as `models/<name>`), written as <models>/models.config,
    so `make run MODELS=dir` serves the models of that directory."""
    text = SERVING_CONFIG.read_text()
    rewritten = text.replace("base_path: 'models/", f"base_path: '{models.resolve()}/")
    if rewritten == text:
        raise SystemExit(f"{SERVING_CONFIG} names no base_path under models/")
    models.mkdir(parents=True, exist_ok=True)
    path = models / "models.config"
    path.write_text(rewritten)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--serving-port", type=int, default=8500)
    parser.add_argument("--gateway-port", type=int, default=50051)
    parser.add_argument("--metrics-port", type=int, default=9090)
    parser.add_argument("--http-port", type=int, default=8080)
    parser.add_argument(
        "--lease", type=Path, help="a file to write now and stop when it is deleted (make's target)"
    )
    args = parser.parse_args()
    stopping = Stopping(args.lease)

    config = _serving_config(args.models)
    models = list(tomllib.loads(MODEL_CONFIG.read_text())["models"])
    serving_cmd = [
        sys.executable,
        "-m",
        "serving.local",
        f"--port={args.serving_port}",
        f"--model_config_file={config}",
        # models.config has version labels; like TF Serving, the server needs this to start.
        "--allow_version_labels_for_unavailable_models",
    ]
    gateway_cmd = [
        sys.executable,
        "-m",
        "gateway",
        # Loopback only, like the local server: a development run is not for the network.
        "--host=127.0.0.1",
        f"--port={args.gateway_port}",
        f"--upstream=127.0.0.1:{args.serving_port}",
        f"--model-config={MODEL_CONFIG}",
        f"--metrics-port={args.metrics_port}",
        f"--http-port={args.http_port}",
        "--health-interval=2",
        # Batch jobs through the API may read the sample images (and uploads).
        f"--batch-allowed-input-uris={(args.models / 'samples').resolve()}",
        # No client certificates here: every caller is anonymous, and anonymous callers share
        # one tenant (each sees, cancels and deletes the others' jobs and uploads).
        "--batch-allow-anonymous=true",
    ]
    env = {**os.environ, "TFS_LOCAL_BIND_HOST": "127.0.0.1"}
    print(
        f"starting local TF Serving-compatible server on 127.0.0.1:{args.serving_port} ...",
        flush=True,
    )
    processes = [_start(serving_cmd, env)]
    try:
        for model in models:
            wait_available(
                f"127.0.0.1:{args.serving_port}", model, processes[0], stopping, timeout=300
            )
        print(f"starting gateway on 127.0.0.1:{args.gateway_port} ...", flush=True)
        processes.append(_start(gateway_cmd))
        _wait_serving(f"127.0.0.1:{args.gateway_port}", processes[1], stopping, timeout=60)
        print(_banner(args, models, _samples(args.models)), flush=True)
        while True:
            for process, name in zip(processes, NAMES, strict=True):
                _poll(process, name, stopping)
            time.sleep(POLL_SECONDS)
    except Stop as stop:
        print(f"\nstopping ({stop}) ...", flush=True)
    finally:
        _stop(processes)
        stopping.release()


if __name__ == "__main__":
    main()
