"""The zoo's instance segmentation models through the gateway (tests/zoo/segmenters.py): TF
Model Garden's Mask R-CNN exported with export_saved_model_lib (`image_tensor`), compared
with its own outputs pasted by Model Garden's paste_instance_masks, and a Keras model with
YOLOv8-seg's head and export layout (head [b, 37, candidates], prototypes channels-last,
`decoder = "yolo-seg"`), compared with Ultralytics' post-processing (NMS, masks at the
photo's size, cropped to the box); served by serving.local, called through a real gateway
process, on PNGs and JPEGs of several sizes and aspect ratios, two EXIF-rotated: the same
instances (class, score within 1e-3, box within 1 px) with each mask's IoU against the
library's at least 0.98. The comparison has teeth: the references follow the image, and a
gateway that swaps the channels fails it.

Built apart from the shared zoo (its own cache, .cache/zoo-segmentation/<key>), in seconds."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.segmentation.v1 import segmentation_pb2 as spb
from gateway.proto.segmentation.v1 import segmentation_pb2_grpc as spb_grpc
from tests.support import masks, tools
from tests.support.gatewayproc import CHANNEL_OPTIONS, run_gateway
from tests.support.localserver import LocalServer, run_local_server
from tests.zoo.compare import BOX_TOLERANCE_PX, DETECTION_SCORE_TOLERANCE, TIMEOUT

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
SOURCES = [HERE / f"{m}.py" for m in ("segmenters", "build", "keypointers")]
MODELS = ("mg_maskrcnn_image_tensor", "yolo_v8_seg_layout")
LEAST_IOU = 0.98
CONFIG = """\
[models.mg_maskrcnn_image_tensor]
task = "instance_segmentation"
[models.mg_maskrcnn_image_tensor.input]
{extra}[models.mg_maskrcnn_image_tensor.outputs]
box_coordinates = "image_info"

[models.yolo_v8_seg_layout]
task = "instance_segmentation"
[models.yolo_v8_seg_layout.input]
scale = 0.00392156862745098
resize_filter = "tf-bilinear"
{extra}[models.yolo_v8_seg_layout.outputs]
decoder = "yolo-seg"
"""


@pytest.fixture(scope="module")
def zoo() -> Path:
    digest = hashlib.sha256()
    for path in (*SOURCES, ROOT / "constraints-zoo.txt"):
        digest.update(path.read_bytes())
    target = ROOT / ".cache" / "zoo-segmentation" / digest.hexdigest()[:16]
    if not (target / "expected.json").exists():
        python = ROOT / ".venv-zoo" / "bin" / "python"
        if not python.exists():
            tools.missing(str(python), "run `make zoo-venv` (make test does)")
        done = subprocess.run([str(python), str(HERE / "segmenters.py"), str(target)],
                              capture_output=True, timeout=1800, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
        for old in target.parent.iterdir():  # older builds go: each is tens of MB
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
    return target


@pytest.fixture(scope="module")
def expected(zoo: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((zoo / "expected.json").read_text())
    return document


@pytest.fixture(scope="module")
def tfs(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("zoo-segmentation")
    config = directory / "models.config"
    entries = "".join(
        f"config {{ name: '{name}' base_path: '{zoo / 'models' / name}' "
        "model_platform: 'tensorflow' }\n"
        for name in MODELS
    )
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={config}"], log_dir=directory) as server:
        yield server


def differences(tfs: LocalServer, zoo: Path, expected: dict[str, Any], directory: Path,
                model: str, extra: str = "") -> tuple[dict[str, str], float]:  # fmt: skip
    """photo -> what differs from the library's instances; and the least mask IoU."""
    config = directory / "models.toml"
    config.write_text(CONFIG.format(extra=extra))
    args = [f"--model-config={config}", f"--model={model}"]
    found: dict[str, str] = {}
    least = 1.0
    with (
        run_gateway(tfs.target, args, log_dir=directory) as gateway,
        grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
    ):
        stub = spb_grpc.SegmentationServiceStub(channel)
        for photo, want in expected["expected"][model].items():
            size = expected["images"][photo]
            request = spb.SegmentRequest(
                image=(zoo / "images" / size["file"]).read_bytes(),
                model=pb.ModelSpec(name=model), min_score=0.25, max_detections=100,
            )  # fmt: skip
            result = stub.Segment(request, timeout=TIMEOUT)
            assert (result.image_width, result.image_height) == (size["width"], size["height"])
            if len(result.instances) != len(want["scores"]):
                found[photo] = (
                    f"{len(result.instances)} instances, the library's {len(want['scores'])}"
                )
                continue
            limits = np.array([size["width"], size["height"]] * 2, dtype=np.float64)
            unmatched = list(result.instances)
            instances = zip(want["classes"], want["scores"], want["boxes"], want["masks"],
                            strict=True)  # fmt: skip
            for class_id, score, box, rle in instances:
                clipped = np.clip(box, 0, limits)
                match = next((g for g in unmatched if _same(g, class_id, score, clipped)), None)
                if match is None:
                    found[photo] = f"no instance matches {(score, box)}"
                    break
                unmatched.remove(match)
                shape = [size["height"], size["width"]]
                iou = masks.iou(masks.rle_decode(list(match.mask.size), match.mask.counts),
                                masks.rle_decode(shape, rle))  # fmt: skip
                least = min(least, iou)
                if iou < LEAST_IOU:
                    found[photo] = f"mask IoU {iou:.4f} for the instance scoring {score:.3f}"
                    break
    return found, least


def _same(got: spb.Instance, class_id: int, score: float, box: Any) -> bool:
    edges = (got.box.x_min, got.box.y_min, got.box.x_max, got.box.y_max)
    return (
        got.class_id == class_id
        and abs(got.score - score) <= DETECTION_SCORE_TOLERANCE
        and all(abs(a - b) <= BOX_TOLERANCE_PX for a, b in zip(edges, box, strict=True))
    )


@pytest.mark.parametrize("model", MODELS)
def test_masks_are_the_librarys_within_iou_098(
    model: str, tfs: LocalServer, zoo: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    wanted = expected["expected"][model]
    assert {"wide320x240", "tall200x300", "photo1200x900", "exif6_600x800",
            "exif3_800x600"} <= set(wanted)  # fmt: skip
    # Random weights (spread for the YOLO head) give instances on the photos, with masks.
    assert sum(len(found["scores"]) for found in wanted.values()) >= 50
    assert all(min(found["areas"], default=1) > 0 for found in wanted.values())
    found, least = differences(tfs, zoo, expected, tmp_path, model)
    assert found == {}
    print(f"{model}: least mask IoU {least:.4f}")


@pytest.mark.parametrize("model", MODELS)
def test_the_references_follow_the_image(model: str, expected: dict[str, Any]) -> None:
    wanted = expected["expected"][model]
    firsts = {photo: found["masks"][0] for photo, found in wanted.items() if found["masks"]}
    assert len(firsts) >= 5 and len(set(firsts.values())) == len(firsts)


@pytest.mark.parametrize("model", MODELS)
def test_channels_swapped_fail_the_comparison(
    model: str, tfs: LocalServer, zoo: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    found, _ = differences(tfs, zoo, expected, tmp_path, model, 'channel_order = "BGR"\n')
    assert found, "channels swapped still match the library"
