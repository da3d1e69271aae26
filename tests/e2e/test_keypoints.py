"""Keypoints end to end: client -> gateway process -> local TF Serving -> keypoint models
exported here with TensorFlow, over gRPC (the points in the caller's pixels, options), HTTP
(JSON, MessagePack, multipart, raw image, /invocations, OpenAPI) and check-models. What every
task does at every door (stream, health, reflection, the client command, detection-batch, a
model of another task refused) is tests/e2e/test_door_matrix.py.

The models find the image's red rectangle and put COCO-17's keypoints on its diagonal: point
k at (x_min + k/16 (x_max - x_min), y_min + k/16 (y_max - y_min)) in pixels of what they
received, with score 0.5 + k/40; so the truth for a drawn rectangle is known in the caller's
pixels, through EXIF orientation and letterboxing. `pose_yolo` gives a YOLOv8-pose raw head
[b, 56, 2] (the rectangle, and a copy 1 px aside that NMS removes), `pose_od` OD API-style
detection_keypoints (normalized y, x) with its boxes.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest

from gateway.proto.keypoints.v1 import keypoints_pb2 as pb
from gateway.proto.keypoints.v1 import keypoints_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.keypoints.names import COCO17_NAMES, COCO17_SKELETON
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.httpcalls import call, multipart, ok_status
from tests.support.keypointmodels import MODEL_CONFIG, expected, export_models, picture
from tests.support.localserver import LocalServer, run_local_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("keypoint-models")
    export_models(root)
    names = {"pose_yolo": "pose_yolo", "pose_letterboxed": "pose_yolo", "pose_od": "pose_od"}
    entries = "".join(
        f"config {{ name: '{n}' base_path: '{root / path}' model_platform: 'tensorflow' }}\n"
        for n, path in names.items()
    )
    config = root / "models.config"
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    (root / "gateway-models.toml").write_text(MODEL_CONFIG)
    with run_local_server([f"--model_config_file={config}"]) as server:
        yield server


@pytest.fixture(scope="module")
def gateway_config(tfs: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keypoint-config") / "models.toml"
    path.write_text(MODEL_CONFIG)
    return path


@pytest.fixture(scope="module")
def gateway(
    tfs: LocalServer, gateway_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    args = [f"--model-config={gateway_config}", "--model=pose_yolo"]
    log_dir = tmp_path_factory.mktemp("keypoint-logs")
    with run_gateway(tfs.target, args, log_dir=log_dir, http=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def stub(gateway: GatewayProcess) -> Iterator[pb_grpc.KeypointServiceStub]:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield pb_grpc.KeypointServiceStub(channel)


def assert_keypoints(
    instance: dict[str, Any], box: tuple[int, int, int, int], tolerance: float
) -> None:
    got = instance["keypoints"]
    assert [p["name"] for p in got] == list(COCO17_NAMES)
    for point, (_, x, y, score) in zip(got, expected(box), strict=True):
        assert abs(point["x"] - x) <= tolerance and abs(point["y"] - y) <= tolerance, point
        assert point["score"] == pytest.approx(score, abs=1e-6)
    edges = instance["box"]
    shown = (edges["x_min"], edges["y_min"], edges["x_max"], edges["y_max"])
    assert max(abs(a - b) for a, b in zip(shown, box, strict=True)) <= max(tolerance, 1)


def as_dict(result: pb.KeypointsResult) -> dict[str, Any]:
    from google.protobuf import json_format

    return json_format.MessageToDict(
        result, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


BOX = (100, 60, 200, 180)


@pytest.mark.parametrize("model", ["pose_yolo", "pose_od"])
def test_keypoints_come_back_in_the_callers_pixels_over_grpc(
    stub: pb_grpc.KeypointServiceStub, model: str
) -> None:
    request = pb.DetectKeypointsRequest(
        image=picture(400, 300, BOX), model=model_pb2.ModelSpec(name=model), request_id="kp-1"
    )
    result = stub.DetectKeypoints(request, timeout=60)
    assert (result.image_width, result.image_height, result.request_id) == (400, 300, "kp-1")
    assert result.model.name == model and result.model.version == 1
    assert len(result.instances) == 1  # the YOLO head's copy is suppressed by NMS
    instance = as_dict(result)["instances"][0]
    assert instance["score"] == pytest.approx(0.9)
    assert_keypoints(instance, BOX, 1e-3)
    assert [(e.start, e.end) for e in result.skeleton] == list(COCO17_SKELETON)


def test_an_exif_rotated_jpeg_and_a_letterboxed_model(stub: pb_grpc.KeypointServiceStub) -> None:
    # Shown 300x400 (stored 400x300, orientation 6).
    shown = (40, 200, 160, 330)
    data = picture(300, 400, shown, fmt="JPEG", orientation=6)
    for model, tolerance in (("pose_yolo", 1.0), ("pose_od", 1.0), ("pose_letterboxed", 4.0)):
        request = pb.DetectKeypointsRequest(image=data, model=model_pb2.ModelSpec(name=model))
        result = stub.DetectKeypoints(request, timeout=60)
        assert (result.image_width, result.image_height) == (300, 400)
        assert len(result.instances) == 1, model
        assert_keypoints(as_dict(result)["instances"][0], shown, tolerance)


def test_options_are_checked_and_applied(stub: pb_grpc.KeypointServiceStub) -> None:
    image = picture(400, 300, BOX)
    high = stub.DetectKeypoints(pb.DetectKeypointsRequest(image=image, min_score=0.95))
    assert list(high.instances) == []
    with pytest.raises(grpc.RpcError) as refused:
        stub.DetectKeypoints(pb.DetectKeypointsRequest(image=image, min_score=2))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_score must be in [0, 1]" in (refused.value.details() or "")


def test_the_http_door_answers_in_every_body_form(gateway: GatewayProcess) -> None:
    image = picture(400, 300, BOX)
    raw = ok_status(call(gateway, "/v1/models/pose_od:keypoints?min_score=0.5", image,
                         "image/png"))  # fmt: skip
    assert set(raw) >= {"instances", "skeleton", "image_width", "image_height", "model"}
    assert raw["skeleton"][0] == {"start": 15, "end": 13}
    assert_keypoints(raw["instances"][0], BOX, 1e-3)
    assert set(raw["instances"][0]) == {"box", "class_id", "label", "score", "keypoints"}
    body = json.dumps({"image": {"b64": base64.b64encode(image).decode()},
                       "max_detections": 1})  # fmt: skip
    as_json = ok_status(
        call(gateway, "/v1/models/pose_yolo/versions/1:keypoints", body.encode(),
             "application/json")
    )  # fmt: skip
    assert_keypoints(as_json["instances"][0], BOX, 1e-3)
    packed = msgpack.packb({"image": image, "min_score": 0.5})
    status, headers, answer = call(
        gateway, "/v1/models/pose_yolo:keypoints", packed, "application/msgpack"
    )
    assert status == 200, answer
    decoded = (
        msgpack.unpackb(answer) if "msgpack" in headers["content-type"] else json.loads(answer)
    )
    assert_keypoints(decoded["instances"][0], BOX, 1e-3)
    form, content_type = multipart({"min_score": "0.5"}, image, "picture.png")
    as_form = ok_status(call(gateway, "/v1/models/pose_yolo:keypoints", form, content_type))
    assert_keypoints(as_form["instances"][0], BOX, 1e-3)
    # /invocations runs the default model's task: keypoints for pose_yolo.
    invoked = ok_status(call(gateway, "/invocations", image, "image/png"))
    assert_keypoints(invoked["instances"][0], BOX, 1e-3)
    spec = ok_status(call(gateway, "/openapi.json"))
    assert "/v1/models/{model}:keypoints" in spec["paths"]


def test_check_models_shows_each_plan(tfs: LocalServer, gateway_config: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-models", "--json", f"--upstream={tfs.target}",
         f"--model-config={gateway_config}", "--model=pose_yolo"],
        capture_output=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    document = json.loads(done.stdout)
    assert done.returncode == 0 and document["ok"], document
    reports = {r["model"]: r for r in document["models"]}
    assert reports["pose_yolo"]["outputs"]["form"].startswith("yolo-pose raw head")
    assert reports["pose_letterboxed"]["input"]["pad_to"]
    assert reports["pose_od"]["outputs"]["keypoints"].startswith("detection_keypoints")
    # The trial image has a red block (and reddish gradient pixels: the models find one
    # instance around both).
    trial = reports["pose_od"]["trial"]
    assert trial["summary"] == {"instances": 1}
    assert trial["result"]["instances"][0]["keypoints"][0]["name"] == "nose"
