"""Instance segmentation through the rest of the doors (tests/e2e/test_segmentation.py's
models and pictures): gRPC health, a model of another task refused naming it, the client's
command over HTTP with a string option (--mask-format), and detection-batch writing JSON Lines
with the HTTP door's fields in input order (masks in the caller's pixels, --mask-format
passed through)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gateway.proto.detection.v1 import detection_pb2 as dpb
from gateway.proto.detection.v1 import detection_pb2_grpc as dpb_grpc
from tests.support.gatewayproc import CHANNEL_OPTIONS, SERVING, GatewayProcess, run_gateway
from tests.support.localserver import run_local_server
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
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("segmentation-batch")
    export_model(root)
    entries = "".join(
        f"config {{ name: '{name}' base_path: '{root / name}' model_platform: 'tensorflow' }}\n"
        for name in ("masks", "masks_yolo")
    )
    (root / "models.config").write_text(f"model_config_list {{\n{entries}}}\n")
    config = root / "models.toml"
    config.write_text(MODEL_CONFIG.split("[models.masks_letterboxed]")[0]
                      + "[models.masks_yolo]\ntask = \"instance_segmentation\"\n"
                      "[models.masks_yolo.outputs]\ndecoder = \"yolo-seg\"\n"
                      "[models.detector]\ntask = \"detection\"\n")  # fmt: skip
    (root / "labels.txt").write_text("background\nshape\n")
    with run_local_server([f"--model_config_file={root / 'models.config'}"]) as tfs:
        args = [f"--model-config={config}", "--model=masks"]
        with run_gateway(tfs.target, args, log_dir=root, http=True) as gw:
            yield gw


def test_health_reports_the_service(gateway: GatewayProcess) -> None:
    assert gateway.health("segmentation.v1.SegmentationService") == SERVING


def test_a_model_of_another_task_is_refused_naming_it(gateway: GatewayProcess) -> None:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        detect = dpb_grpc.DetectionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            detect.Detect(dpb.DetectRequest(image=picture(TRUTH),
                                            model=dpb.ModelSpec(name="masks")))  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'masks' is configured as" in (refused.value.details() or "")


def test_the_client_command_over_http(gateway: GatewayProcess, tmp_path: Path) -> None:
    path = tmp_path / "picture.png"
    path.write_bytes(picture(TRUTH))
    done = subprocess.run(
        [sys.executable, "-m", "gateway.client", str(path), "--task=segment",
         f"--http={gateway.http_url}", "--model=masks_yolo", "--mask-format=png"],
        capture_output=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    (line,) = done.stdout.decode().splitlines()
    instance = json.loads(line)["instances"][0]
    assert instance["mask"]["png"]
    assert_instance(instance, TRUTH, BOX, 0.97)


def test_detection_batch_writes_the_http_doors_fields(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    images = tmp_path / "dataset"
    images.mkdir()
    rotated_box, other = (40, 200, 160, 330), (10, 20, 90, 130)
    rotated, small = shape(300, 400, rotated_box), shape(320, 240, other)
    (images / "a.png").write_bytes(picture(TRUTH))
    (images / "b.png").write_bytes(b"not an image")
    (images / "c.jpg").write_bytes(picture(rotated, "JPEG", 6))
    (images / "d.png").write_bytes(picture(small))
    out = tmp_path / "batch-out"
    done = subprocess.run(
        [sys.executable, "-m", "gateway.jobs.runner", str(images), str(out),
         f"--target={gateway.target}", "--task=segment", "--model=masks",
         "--mask-format=polygon"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (results,) = out.glob("results-*.jsonl")
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a.png", "b.png", "c.jpg", "d.png"]
    assert lines[1]["error"]["code"] == "INVALID_ARGUMENT"
    first = lines[0]["result"]
    assert set(first) == {"instances", "image_width", "image_height", "model", "request_id"}
    assert set(first["instances"][0]["mask"]) == {"size", "polygons"}
    assert_instance(first["instances"][0], TRUTH, BOX, 0.97)
    assert_instance(lines[2]["result"]["instances"][0], rotated, rotated_box, 0.95)
    assert_instance(lines[3]["result"]["instances"][0], small, other, 0.95)
