"""Instance segmentation through the rest of the doors (tests/e2e/test_segmentation.py's
models and pictures): gRPC health, a model of another task refused naming it, the client's
command over HTTP with a string option (--mask-format)."""

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
from tests.e2e.test_segmentation import (
    BOX,
    MODEL_CONFIG,
    TRUTH,
    assert_instance,
    export_model,
    picture,
)
from tests.support.gatewayproc import CHANNEL_OPTIONS, SERVING, GatewayProcess, run_gateway
from tests.support.localserver import run_local_server

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
