"""Instance segmentation end to end: client -> gateway process -> local TF Serving -> a
Mask R-CNN-style model exported here with TensorFlow, over gRPC (unary, reflection), HTTP
(JSON, MessagePack, multipart, raw image, /invocations, OpenAPI), the client's command line
with a mask format and check-models. What every task does at every door (stream, health, the
client command over HTTP, detection-batch, a model of another task refused) is
tests/e2e/test_door_matrix.py.

The model finds the image's red pixels: its one detection is their bounding box
(detection_boxes, normalized, as the OD API and Model Garden's normalized export give them)
and its mask the red share of each of 32 x 32 cells over the box (detection_masks,
box-relative [1, N, 32, 32], sampled with crop_and_resize at the cells' centres). The
picture is a red L, so the truth in the caller's pixels is known (through EXIF orientation
and letterboxing) and a mask pasted turned, shifted or mirrored fails. `masks_yolo` gives
the same as a YOLOv8-seg raw head: `output0` [b, 4 + 1 + 1, 2] (the box in pixels, a score,
one mask coefficient; a copy 1 px aside that NMS removes) and `output1` prototypes [b, 1,
h/4, w/4] (the red share of each 4 x 4 block as logits).
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
import numpy as np
import pytest

from gateway.proto.segmentation.v1 import segmentation_pb2 as pb
from gateway.proto.segmentation.v1 import segmentation_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support import masks
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.httpcalls import call, multipart, ok_status
from tests.support.localserver import LocalServer, run_local_server
from tests.support.segmentmodels import (
    BOX,
    MODEL_CONFIG,
    TRUTH,
    assert_instance,
    export_model,
    picture,
    shape,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("segmentation-models")
    export_model(root)
    paths = {"masks": "masks", "masks_letterboxed": "masks", "masks_yolo": "masks_yolo"}
    entries = "".join(
        f"config {{ name: '{name}' base_path: '{root / path}' model_platform: 'tensorflow' }}\n"
        for name, path in paths.items()
    )
    config = root / "models.config"
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={config}"]) as server:
        yield server


@pytest.fixture(scope="module")
def gateway_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("segmentation-config") / "models.toml"
    path.write_text(MODEL_CONFIG)
    (path.parent / "labels.txt").write_text("background\nshape\n")
    return path


@pytest.fixture(scope="module")
def gateway(
    tfs: LocalServer, gateway_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    args = [f"--model-config={gateway_config}", "--model=masks"]
    log_dir = tmp_path_factory.mktemp("segmentation-logs")
    with run_gateway(tfs.target, args, log_dir=log_dir, http=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def stub(gateway: GatewayProcess) -> Iterator[pb_grpc.SegmentationServiceStub]:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield pb_grpc.SegmentationServiceStub(channel)


def as_dict(result: pb.SegmentationResult) -> dict[str, Any]:
    from google.protobuf import json_format

    return json_format.MessageToDict(
        result, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


@pytest.mark.parametrize("model", ["masks", "masks_yolo"])
def test_masks_come_back_in_the_callers_pixels_over_grpc(
    stub: pb_grpc.SegmentationServiceStub, model: str
) -> None:
    request = pb.SegmentRequest(
        image=picture(TRUTH), model=model_pb2.ModelSpec(name=model), request_id="seg-1"
    )
    result = stub.Segment(request, timeout=60)
    assert (result.image_width, result.image_height, result.request_id) == (400, 300, "seg-1")
    assert result.model.name == model and result.model.version == 1
    assert len(result.instances) == 1  # the YOLO head's copy is suppressed by NMS
    instance = as_dict(result)["instances"][0]
    expected = (1, "shape") if model == "masks" else (0, "class_0")
    assert (instance["class_id"], instance["label"]) == expected
    assert instance["score"] == pytest.approx(0.9)
    assert set(instance["mask"]) == {"size", "counts", "polygons"}
    mask = assert_instance(instance, TRUTH, BOX, 0.97)
    # Pasted in the box, nowhere else; the L's missing quarter is missing.
    assert not mask[:, : BOX[0] - 1].any() and not mask[: BOX[1] - 1].any()
    assert not mask[BOX[1] + 2 : 115, 165:].any()


def test_an_exif_rotated_jpeg_and_a_letterboxed_model(
    stub: pb_grpc.SegmentationServiceStub,
) -> None:
    box = (40, 200, 160, 330)  # shown 300x400 (stored 400x300, orientation 6)
    truth = shape(300, 400, box)
    data = picture(truth, fmt="JPEG", orientation=6)
    for model, least in (("masks", 0.95), ("masks_letterboxed", 0.9), ("masks_yolo", 0.95)):
        request = pb.SegmentRequest(image=data, model=model_pb2.ModelSpec(name=model))
        result = stub.Segment(request, timeout=60)
        assert (result.image_width, result.image_height) == (300, 400)
        assert len(result.instances) == 1, model
        assert_instance(as_dict(result)["instances"][0], truth, box, least)


def test_every_mask_format_gives_the_same_pixels(stub: pb_grpc.SegmentationServiceStub) -> None:
    image = picture(TRUTH)
    found = {}
    for mask_format in ("", "rle", "POLYGON", "png"):
        result = stub.Segment(pb.SegmentRequest(image=image, mask_format=mask_format))
        instance = as_dict(result)["instances"][0]
        found[mask_format] = masks.decode(instance["mask"])
    assert found["POLYGON"].any()
    for mask in found.values():
        assert np.array_equal(mask, found["rle"])
    # A higher threshold takes pixels away at the L's edges only.
    strict = stub.Segment(pb.SegmentRequest(image=image, mask_threshold=0.95))
    strict_mask = masks.decode(as_dict(strict)["instances"][0]["mask"])
    assert np.count_nonzero(strict_mask) < np.count_nonzero(found["rle"])
    assert not (strict_mask & ~found["rle"]).any()


def test_options_are_checked_and_applied(stub: pb_grpc.SegmentationServiceStub) -> None:
    image = picture(TRUTH)
    high = stub.Segment(pb.SegmentRequest(image=image, min_score=0.95))
    assert list(high.instances) == []
    for request, message in (
        (pb.SegmentRequest(image=image, min_score=2), "min_score must be in [0, 1]"),
        (pb.SegmentRequest(image=image, mask_threshold=1.5), "mask_threshold must be in [0, 1)"),
        (pb.SegmentRequest(image=image, mask_format="jpeg"), "mask_format must be one of rle"),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Segment(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (refused.value.details() or "")


def test_the_http_door_answers_in_every_body_form(gateway: GatewayProcess) -> None:
    image = picture(TRUTH)
    raw = ok_status(
        call(gateway, "/v1/models/masks:segment?mask_format=polygon", image, "image/png")
    )
    assert set(raw) >= {"instances", "image_width", "image_height", "model", "request_id"}
    assert set(raw["instances"][0]) == {"box", "class_id", "label", "score", "mask"}
    assert "counts" not in raw["instances"][0]["mask"]
    assert_instance(raw["instances"][0], TRUTH, BOX, 0.97)
    body = json.dumps({"image": {"b64": base64.b64encode(image).decode()},
                       "mask_format": "png", "max_detections": 1})  # fmt: skip
    as_json = ok_status(
        call(gateway, "/v1/models/masks/versions/1:segment", body.encode(), "application/json")
    )
    assert_instance(as_json["instances"][0], TRUTH, BOX, 0.97)
    packed = msgpack.packb({"image": image, "mask_threshold": 0.5})
    status, headers, answer = call(gateway, "/v1/models/masks:segment", packed,
                                   "application/msgpack")  # fmt: skip
    assert status == 200, answer
    decoded = (
        msgpack.unpackb(answer) if "msgpack" in headers["content-type"] else json.loads(answer)
    )
    assert_instance(decoded["instances"][0], TRUTH, BOX, 0.97)
    form, content_type = multipart({"mask_format": "rle"}, image, "picture.png")
    as_form = ok_status(call(gateway, "/v1/models/masks:segment", form, content_type))
    assert_instance(as_form["instances"][0], TRUTH, BOX, 0.97)
    # /invocations runs the default model's task: instance segmentation for `masks`.
    invoked = ok_status(call(gateway, "/invocations", image, "image/png"))
    assert_instance(invoked["instances"][0], TRUTH, BOX, 0.97)
    status, _, refused = call(gateway, "/v1/models/masks:segment?mask_format=svg", image,
                              "image/png")  # fmt: skip
    assert status == 400 and b"mask_format must be one of" in refused
    spec = ok_status(call(gateway, "/openapi.json"))
    assert "/v1/models/{model}:segment" in spec["paths"]


def test_reflection_and_the_client_command(gateway: GatewayProcess, tmp_path: Path) -> None:
    from tests.support import tools

    path = tmp_path / "picture.png"
    path.write_bytes(picture(TRUTH))
    done = subprocess.run(
        [sys.executable, "-m", "gateway.client", str(path), "--task=segment",
         f"--target={gateway.target}", "--model=masks", "--mask-format=polygon"],
        capture_output=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    line = json.loads(done.stdout.decode().splitlines()[0])
    assert line["instances"][0]["mask"]["polygons"]
    assert_instance(line["instances"][0], TRUTH, BOX, 0.97)
    grpcurl = tools.binary("grpcurl", tools.GRPCURL_INSTALL)
    listed = subprocess.run(
        [grpcurl, "-plaintext", gateway.target, "describe", "segmentation.v1.SegmentationService"],
        capture_output=True, timeout=60, check=True,
    ).stdout.decode()  # fmt: skip
    assert "rpc SegmentStream ( stream .segmentation.v1.SegmentRequest )" in listed


def test_check_models_shows_the_plan(tfs: LocalServer, gateway_config: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-models", "--json", f"--upstream={tfs.target}",
         f"--model-config={gateway_config}", "--model=masks"],
        capture_output=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    document = json.loads(done.stdout)
    assert done.returncode == 0 and document["ok"], document
    reports = {r["model"]: r for r in document["models"]}
    assert reports["masks"]["outputs"]["masks"].startswith("detection_masks")
    assert reports["masks_letterboxed"]["input"]["pad_to"]
    assert reports["masks_yolo"]["outputs"]["form"].startswith("yolo-seg raw head")
    assert reports["masks_yolo"]["outputs"]["prototypes"] == "output1"
    trial = reports["masks"]["trial"]
    assert trial["summary"] == {"instances": 1}
    assert trial["result"]["instances"][0]["mask"]["size"]
