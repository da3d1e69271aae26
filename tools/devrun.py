"""`make run`: the local TF Serving-compatible server and the gateway, side by side.

Starts `python -m serving.local` on the reference models, waits until they are AVAILABLE,
starts the gateway against it, writes a sample image, and prints ready-to-paste grpcurl and
client commands. Ctrl-C (or SIGTERM) stops both.

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


def wait_available(
    target: str, model: str, process: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        status = channel.unary_unary(
            GET_MODEL_STATUS,
            request_serializer=tfs.GetModelStatusRequest.SerializeToString,
            response_deserializer=tfs.GetModelStatusResponse.FromString,
        )
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the local TF Serving server exited with {process.returncode}")
            try:
                response = status(
                    tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name=model)), timeout=2
                )
                if any(
                    s.state == tfs.ModelVersionStatus.AVAILABLE
                    for s in response.model_version_status
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    raise SystemExit(f"model {model} did not become AVAILABLE within {timeout:.0f} s")


def _wait_serving(target: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    # The overall status (""): SERVING once the gateway serves its default model.
    request = health_pb2.HealthCheckRequest(service="")
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the gateway exited with {process.returncode}")
            try:
                if stub.Check(request, timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SystemExit(f"the gateway did not become ready within {timeout:.0f} s")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _sample_image(models: Path) -> Path:
    path = models / "samples" / "scene.jpg"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(scenes.encode(scenes.sample_scene().pixels, "JPEG"))
    return path


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
    args = parser.parse_args()

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
    serving = subprocess.Popen(serving_cmd, env=env)
    processes = [serving]
    try:
        for model in models:
            wait_available(f"127.0.0.1:{args.serving_port}", model, serving, timeout=300)
        print(f"starting gateway on 127.0.0.1:{args.gateway_port} ...", flush=True)
        gateway = subprocess.Popen(gateway_cmd)
        processes.append(gateway)
        _wait_serving(f"127.0.0.1:{args.gateway_port}", gateway, timeout=60)
        sample = _sample_image(args.models)
        grpcurl = Path(sys.executable).parent / "grpcurl"
        print(
            f"""
ready:
  gateway (detection.v1, classification.v1) localhost:{args.gateway_port}
  models                                    {", ".join(models)}
  local TF Serving (gRPC)                   localhost:{args.serving_port}
  gateway HTTP door and page                http://localhost:{args.http_port}/
  gateway metrics                           http://localhost:{args.metrics_port}/metrics
  batch jobs                                open to anonymous callers, all as one tenant

try:
  {sys.executable} -m gateway.client {sample} --target localhost:{args.gateway_port}

  {grpcurl} -plaintext -max-msg-sz 67108864 \\
    -d "{{\\"image\\": \\"$(base64 -w0 {sample})\\", \\"min_score\\": 0.5}}" \\
    localhost:{args.gateway_port} detection.v1.DetectionService/Detect

  {sys.executable} -m gateway.client {sample} --task classify --model classifier_logits \\
    --target localhost:{args.gateway_port}

  curl -s -H 'Content-Type: image/jpeg' --data-binary @{sample} \\
    'http://localhost:{args.http_port}/v1/models/detector:detect?min_score=0.5'

Ctrl-C stops both.
""",
            flush=True,
        )
        signal.signal(signal.SIGTERM, _interrupt)
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        print("a process exited; stopping the other", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
    finally:
        for p in reversed(processes):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(processes):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
