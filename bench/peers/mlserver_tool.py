"""Starting the MLServer peer (bench/peers/mlserver_runtime.py) and talking to it, in its venv.

    PY=$(python -m bench.peers.venvs)/mlserver/bin/python
    $PY -m bench.peers.mlserver_tool serve --folder DIR --http-port 8080 --grpc-port 8081 \\
        --metrics-port 8082 --upstream 127.0.0.1:8500
    $PY -m bench.peers.mlserver_tool body IMAGE OUT        # the gRPC request's bytes

`--model classifier` (serve, body) serves and calls the classifier with adaptive batching
(bench/peers/mlserver_classifier.py, for bench/batching.py) instead of the detector.
    $PY -m bench.peers.mlserver_tool probe TARGET IMAGE    # its answer, as JSON

`serve` writes MLServer's settings files and replaces itself with `mlserver start` (the same
process id, so the bench measures MLServer's own process and the worker it starts). No
TensorFlow here: only the runtime, which MLServer imports in its worker, needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import grpc
from mlserver.grpc import dataplane_pb2 as oip
from mlserver.grpc import dataplane_pb2_grpc as oip_grpc

from bench.peers import odapi

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
ROOT = Path(__file__).resolve().parents[2]


# The classifier's adaptive batching (MLServer's model settings): as many images per call as
# the gateway's default `max_batch`, waiting at most 5 ms for them.
CLASSIFIER = "classifier"
MAX_BATCH_SIZE = 8
MAX_BATCH_TIME = 0.005


def write_settings(
    folder: Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    upstream: str,
    model_name: str = odapi.MODEL,
) -> None:
    """settings.json (server) and <model>/model-settings.json (the model), as MLServer reads
    them from the folder `mlserver start` is given."""
    server = {
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
    }
    (folder / "settings.json").write_text(json.dumps(server))
    model = folder / model_name
    model.mkdir(exist_ok=True)
    settings: dict[str, Any] = {
        "name": model_name,
        "implementation": "bench.peers.mlserver_runtime.Detector",
        "parameters": {"extra": {"upstream": upstream}},
    }
    if model_name == CLASSIFIER:
        settings["implementation"] = "bench.peers.mlserver_classifier.Classifier"
        settings["max_batch_size"] = MAX_BATCH_SIZE
        settings["max_batch_time"] = MAX_BATCH_TIME
    (model / "model-settings.json").write_text(json.dumps(settings))


def infer_request(image: bytes, model_name: str = odapi.MODEL) -> oip.ModelInferRequest:
    """The gRPC ModelInfer request for one image: one BYTES element, raw."""
    request = oip.ModelInferRequest(model_name=model_name)
    request.inputs.add(name="image", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        image
    )
    return request


def rest_body(image_b64: str) -> dict[str, Any]:
    """The REST (JSON) body for one base64 image."""
    return {
        "inputs": [
            {
                "name": "image",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"content_type": "base64"},
                "data": [image_b64],
            }
        ]
    }


def answer(response: oip.ModelInferResponse) -> dict[str, Any]:
    """A gRPC ModelInferResponse as the typed answer (bench.peers compares answers)."""
    outputs = {o.name: o for o in response.outputs}
    boxes = list(outputs["boxes"].contents.int_contents)
    width, height = outputs["image_size"].contents.int_contents
    detections = [
        {
            "class_id": class_id,
            "label": label.decode(),
            "score": score,
            "box": dict(
                zip(("x_min", "y_min", "x_max", "y_max"), boxes[4 * i : 4 * i + 4], strict=True)
            ),
        }
        for i, (class_id, label, score) in enumerate(
            zip(
                outputs["class_ids"].contents.int_contents,
                outputs["labels"].contents.bytes_contents,
                outputs["scores"].contents.fp32_contents,
                strict=True,
            )
        )
    ]
    return {"detections": detections, "image_width": width, "image_height": height}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    serve = sub.add_parser("serve", help="write the settings, then exec `mlserver start`")
    serve.add_argument("--folder", type=Path, required=True)
    for port in ("--http-port", "--grpc-port", "--metrics-port"):
        serve.add_argument(port, type=int, required=True)
    serve.add_argument("--upstream", required=True)
    body = sub.add_parser("body", help="write the serialized ModelInferRequest for an image")
    body.add_argument("image", type=Path)
    body.add_argument("out", type=Path)
    for command in (serve, body):
        command.add_argument("--model", choices=(odapi.MODEL, CLASSIFIER), default=odapi.MODEL)
    probe = sub.add_parser("probe", help="one gRPC ModelInfer; print the answer as JSON")
    probe.add_argument("target")
    probe.add_argument("image", type=Path)
    args = parser.parse_args()
    if args.what == "serve":
        write_settings(args.folder, args.http_port, args.grpc_port, args.metrics_port,
                       args.upstream, args.model)  # fmt: skip
        mlserver = shutil.which("mlserver", path=str(Path(sys.executable).parent))
        if mlserver is None:
            raise SystemExit("the mlserver command is not in this venv")
        os.chdir(args.folder)  # MLServer keeps .metrics/ and .envs/ in its working directory
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        os.execve(mlserver, [mlserver, "start", str(args.folder)], env)
    elif args.what == "body":
        request = infer_request(args.image.read_bytes(), args.model)
        args.out.write_bytes(request.SerializeToString())
    else:
        with grpc.insecure_channel(args.target, options=odapi.CHANNEL_OPTIONS) as channel:
            stub = oip_grpc.GRPCInferenceServiceStub(channel)
            response = stub.ModelInfer(infer_request(args.image.read_bytes()), timeout=60)
        print(json.dumps(answer(response)))


if __name__ == "__main__":
    main()
