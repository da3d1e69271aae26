"""The zoo's instance segmentation model through the gateway (tests/zoo/segmenters.py): a
Keras model with YOLOv8-seg's head and export layout (head [b, 37, candidates], prototypes
channels-last), served by serving.local, called through a real gateway process with `decoder
= "yolo-seg"`, and compared with Ultralytics' post-processing of the model's own outputs
(NMS, masks at the photo's size, cropped to the box), on PNGs and JPEGs of several sizes and
aspect ratios, two EXIF-rotated: the same instances (score within 1e-3, box within 1 px) with
each mask's IoU against the library's at least 0.98. The comparison has teeth: the references
follow the image, and a gateway that swaps the channels fails it.

Built apart from the shared zoo (its own cache, .cache/zoo-segmentation/<key>), in seconds."""

from __future__ import annotations

import hashlib
import json
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
MODEL = "yolo_v8_seg_layout"
LEAST_IOU = 0.98
CONFIG = f"""\
[models.{MODEL}]
task = "instance_segmentation"
[models.{MODEL}.input]
scale = 0.00392156862745098
resize_filter = "tf-bilinear"
{{extra}}[models.{MODEL}.outputs]
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
    return target


@pytest.fixture(scope="module")
def expected(zoo: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((zoo / "expected.json").read_text())
    return document


@pytest.fixture(scope="module")
def tfs(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("zoo-segmentation")
    config = directory / "models.config"
    base = zoo / "models" / MODEL
    config.write_text(f"model_config_list {{ config {{ name: '{MODEL}' base_path: '{base}' "
                      "model_platform: 'tensorflow' } }\n")  # fmt: skip
    with run_local_server([f"--model_config_file={config}"], log_dir=directory) as server:
        yield server


def differences(tfs: LocalServer, zoo: Path, expected: dict[str, Any], directory: Path,
                extra: str = "") -> tuple[dict[str, str], float]:  # fmt: skip
    """photo -> what differs from the library's instances; and the least mask IoU."""
    config = directory / "models.toml"
    config.write_text(CONFIG.format(extra=extra))
    args = [f"--model-config={config}", f"--model={MODEL}"]
    found: dict[str, str] = {}
    least = 1.0
    with (
        run_gateway(tfs.target, args, log_dir=directory) as gateway,
        grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
    ):
        stub = spb_grpc.SegmentationServiceStub(channel)
        for photo, want in expected["expected"][MODEL].items():
            size = expected["images"][photo]
            request = spb.SegmentRequest(
                image=(zoo / "images" / size["file"]).read_bytes(),
                model=pb.ModelSpec(name=MODEL), min_score=0.25, max_detections=100,
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
            for score, box, rle in zip(want["scores"], want["boxes"], want["masks"], strict=True):
                clipped = np.clip(box, 0, limits)
                match = next((g for g in unmatched if _same(g, score, clipped)), None)
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


def _same(got: spb.Instance, score: float, box: Any) -> bool:
    edges = (got.box.x_min, got.box.y_min, got.box.x_max, got.box.y_max)
    return abs(got.score - score) <= DETECTION_SCORE_TOLERANCE and all(
        abs(a - b) <= BOX_TOLERANCE_PX for a, b in zip(edges, box, strict=True)
    )


def test_masks_are_ultralytics_within_iou_098(
    tfs: LocalServer, zoo: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    wanted = expected["expected"][MODEL]
    assert {"wide320x240", "tall200x300", "photo1200x900", "exif6_600x800",
            "exif3_800x600"} <= set(wanted)  # fmt: skip
    # Random weights spread so that every photo has instances with masks of some size.
    assert all(len(found["scores"]) >= 3 and min(found["areas"]) > 0 for found in wanted.values())
    found, least = differences(tfs, zoo, expected, tmp_path)
    assert found == {}
    print(f"least mask IoU {least:.4f}")


def test_the_references_follow_the_image(expected: dict[str, Any]) -> None:
    wanted = expected["expected"][MODEL]
    firsts = {photo: found["masks"][0] for photo, found in wanted.items()}
    assert len(set(firsts.values())) == len(firsts)


def test_channels_swapped_fail_the_comparison(
    tfs: LocalServer, zoo: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    found, _ = differences(tfs, zoo, expected, tmp_path, extra='channel_order = "BGR"\n')
    assert found, "channels swapped still match the library"
