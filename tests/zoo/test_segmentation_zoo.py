"""The zoo's instance segmentation models through the gateway (tests/zoo/segmenters.py): TF
Model Garden's Mask R-CNN exported with export_saved_model_lib (`image_tensor`), compared
with its own outputs pasted by Model Garden's paste_instance_masks, and a Keras model with
YOLOv8-seg's head and export layout (head [b, 37, candidates], prototypes channels-last,
`decoder = "yolo-seg"`), compared in both `mask_resolution`s with Ultralytics' own
post-processing run by the library (tests/zoo/ultralytics_masks.py in .venv-ultralytics:
non_max_suppression, then process_mask_native for `native`, process_mask and scale_masks for
`input`); served by serving.local, called through a real gateway process, on PNGs and JPEGs of
several sizes and aspect ratios, two EXIF-rotated: the same instances (class, score within
1e-3, box within 1 px) with each mask's IoU against the library's at least 0.98. The
comparison has teeth: the references follow the image, the two modes' references differ,
and a gateway that swaps the channels fails it.

Built apart from the shared zoo, once per machine and content (tests/zoo/cache.py:
~/.cache/tfs-detection-gateway/zoo-segmentation/<key>, by `make zoo` before pytest starts), in
a minute or two."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.proto.segmentation.v1 import segmentation_pb2 as spb
from gateway.proto.segmentation.v1 import segmentation_pb2_grpc as spb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support import masks
from tests.support.gatewayproc import CHANNEL_OPTIONS, run_gateway
from tests.support.localserver import LocalServer, run_local_server
from tests.zoo.cache import ZooBuildError, build_segmentation_zoo
from tests.zoo.compare import BOX_TOLERANCE_PX, DETECTION_SCORE_TOLERANCE, TIMEOUT

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(3600)]

MODELS = ("mg_maskrcnn_image_tensor", "yolo_v8_seg_layout")
YOLO = "yolo_v8_seg_layout"
# The cases compared: (model, mask_resolution), the Mask R-CNN's masks being box-relative.
CASES = [("mg_maskrcnn_image_tensor", ""), (YOLO, "native"), (YOLO, "input")]
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
mask_resolution = "{resolution}"
"""


@pytest.fixture(scope="module")
def zoo() -> Path:
    try:
        return build_segmentation_zoo()
    except ZooBuildError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="module")
def expected(zoo: Path) -> dict[str, Any]:
    """Per model and photo, the library's instances: classes, scores, boxes (x1, y1, x2, y2
    in pixels of the photo as shown) and masks ([height, width] bools), per mode for YOLO."""
    document: dict[str, Any] = json.loads((zoo / "expected.json").read_text())
    found: dict[str, Any] = {}
    for photo, want in document["expected"]["mg_maskrcnn_image_tensor"].items():
        shape = [document["images"][photo]["height"], document["images"][photo]["width"]]
        found.setdefault("mg_maskrcnn_image_tensor", {})[photo] = {
            **want,
            "masks": [masks.rle_decode(shape, rle) for rle in want["masks"]],
        }
    library = zoo / "ultralytics"
    versions = json.loads((library / "done.json").read_text())
    assert versions["empty_masks"] == 0, versions
    for photo in document["expected"][YOLO]:
        saved = np.load(library / f"{photo}.npz")
        common = {"classes": saved["classes"].tolist(), "scores": saved["scores"].tolist(),
                  "boxes": saved["boxes"].tolist()}  # fmt: skip
        for mode in ("native", "input"):
            found.setdefault(f"{YOLO}:{mode}", {})[photo] = {
                **common,
                "masks": list(saved[mode]),
                "areas": saved[mode].sum((1, 2)).tolist(),
            }
    return {"images": document["images"], "expected": found, "ultralytics": versions}


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
                model: str, resolution: str, extra: str = "",
                ) -> tuple[dict[str, str], list[float]]:  # fmt: skip
    """photo -> what differs from the library's instances (of `resolution`, for YOLO); and
    the mask IoUs."""
    config = directory / "models.toml"
    config.write_text(CONFIG.format(extra=extra, resolution=resolution or "native"))
    library = expected["expected"][f"{model}:{resolution}" if resolution else model]
    # The Mask R-CNN's first calls take tens of seconds on a loaded machine: the upstream
    # timeout is the client's deadline, not the gateway's 30 s default.
    args = [f"--model-config={config}", f"--model={model}", f"--upstream-timeout={TIMEOUT}"]
    found: dict[str, str] = {}
    ious: list[float] = []
    with (
        run_gateway(tfs.target, args, log_dir=directory) as gateway,
        grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
    ):
        stub = spb_grpc.SegmentationServiceStub(channel)
        for photo, want in library.items():
            size = expected["images"][photo]
            request = spb.SegmentRequest(
                image=(zoo / "images" / size["file"]).read_bytes(),
                model=model_pb2.ModelSpec(name=model), min_score=0.25, max_detections=100,
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
            for class_id, score, box, wanted in instances:
                clipped = np.clip(box, 0, limits)
                match = next((g for g in unmatched if _same(g, class_id, score, clipped)), None)
                if match is None:
                    found[photo] = f"no instance matches {(score, box)}"
                    break
                unmatched.remove(match)
                iou = masks.iou(masks.rle_decode(list(match.mask.size), match.mask.counts),
                                wanted)  # fmt: skip
                ious.append(iou)
                if iou < LEAST_IOU:
                    found[photo] = f"mask IoU {iou:.4f} for the instance scoring {score:.3f}"
                    break
    return found, ious


def _same(got: spb.Instance, class_id: int, score: float, box: Any) -> bool:
    edges = (got.box.x_min, got.box.y_min, got.box.x_max, got.box.y_max)
    return (
        got.class_id == class_id
        and abs(got.score - score) <= DETECTION_SCORE_TOLERANCE
        and all(abs(a - b) <= BOX_TOLERANCE_PX for a, b in zip(edges, box, strict=True))
    )


@pytest.mark.parametrize("model, resolution", CASES)
def test_masks_are_the_librarys_within_iou_098(
    model: str, resolution: str, tfs: LocalServer, zoo: Path, expected: dict[str, Any],
    tmp_path: Path,
) -> None:  # fmt: skip
    wanted = expected["expected"][f"{model}:{resolution}" if resolution else model]
    assert {"wide320x240", "tall200x300", "photo1200x900", "exif6_600x800",
            "exif3_800x600"} <= set(wanted)  # fmt: skip
    # Random weights (spread for the YOLO head) give instances on the photos, with masks.
    assert sum(len(found["scores"]) for found in wanted.values()) >= 50
    assert all(min(found["areas"], default=1) > 0 for found in wanted.values())
    found, ious = differences(tfs, zoo, expected, tmp_path, model, resolution)
    assert found == {}
    print(f"{model} {resolution}: {len(ious)} instances on {len(wanted)} photos, least mask "
          f"IoU {min(ious):.4f}, mean {np.mean(ious):.4f}")  # fmt: skip


def test_the_two_resolutions_differ(expected: dict[str, Any]) -> None:
    """Ultralytics' two ways give different masks on the same instances (the reason to offer
    both): on every photo of another size than the input some instance's masks differ by more
    than the tolerance; on the photo of the input's size (320x320) they are the same."""
    native, at_input = (expected["expected"][f"{YOLO}:{mode}"] for mode in ("native", "input"))
    ious = {photo: [masks.iou(a, b) for a, b in zip(native[photo]["masks"],
                                                     at_input[photo]["masks"], strict=True)]
            for photo in native}  # fmt: skip
    assert all(v == 1.0 for v in ious.pop("yolo320")), "the input's size: the same masks"
    assert all(values and min(values) < LEAST_IOU for values in ious.values()), ious
    everything = [v for values in ious.values() for v in values]
    print(f"native vs input: least IoU {min(everything):.4f}, mean {np.mean(everything):.4f}")


@pytest.mark.parametrize("model", MODELS)
def test_the_references_follow_the_image(model: str, expected: dict[str, Any]) -> None:
    wanted = expected["expected"][model if model != YOLO else f"{YOLO}:native"]
    firsts = {photo: found["masks"][0].tobytes() for photo, found in wanted.items()
              if len(found["masks"])}  # fmt: skip
    assert len(firsts) >= 5 and len(set(firsts.values())) == len(firsts)


@pytest.mark.parametrize("model, resolution", CASES)
def test_channels_swapped_fail_the_comparison(
    model: str, resolution: str, tfs: LocalServer, zoo: Path, expected: dict[str, Any],
    tmp_path: Path,
) -> None:  # fmt: skip
    found, _ = differences(tfs, zoo, expected, tmp_path, model, resolution,
                           'channel_order = "BGR"\n')  # fmt: skip
    assert found, "channels swapped still match the library"
