"""The zoo's keypoint models through the gateway (tests/zoo/keypointers.py): a Keras model with
YOLOv8-pose's head and export layout, and the same network with NMS in its graph behind an OD
API-style signature (detection_keypoints), served by serving.local, called through a real
gateway process with tests/zoo/models.toml, and compared with Ultralytics' post-processing of
the model's own output (NMS, keypoints scaled to the photo and clipped; for the OD API-style
export, its own outputs),
on PNGs and JPEGs of several sizes and aspect ratios, two EXIF-rotated: the same instances
(class, score within 1e-3, box within 1 px) with every keypoint within 1 px and its score
within 1e-3. The comparison has teeth: the references follow the image, and a gateway whose
config makes a preprocessing mistake (channels swapped, the fast resize) fails it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.proto.keypoints.v1 import keypoints_pb2 as kpb
from gateway.proto.keypoints.v1 import keypoints_pb2_grpc as kpb_grpc
from gateway.proto.vision.v1 import model_pb2
from gateway.tasks.keypoints.names import COCO17_NAMES, COCO17_SKELETON
from tests.support.gatewayproc import CHANNEL_OPTIONS, run_gateway
from tests.support.localserver import LocalServer
from tests.support.zoomistakes import wrong_config
from tests.zoo.compare import BOX_TOLERANCE_PX, DETECTION_SCORE_TOLERANCE, TIMEOUT, image
from tests.zoo.conftest import DETECTORS, KEYPOINTERS

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(5400)]

POINT_TOLERANCE_PX = 1.0
POINT_SCORE_TOLERANCE = 1e-3
# The mistakes that apply to the YOLO-pose model (it takes RGB in [0, 1], no mean).
MISTAKES = ("channels swapped", "fast resize")


def keypoint_differences(
    channel: grpc.Channel, model: str, zoo: Path, expected: dict[str, Any]
) -> dict[str, str]:
    """photo -> what differs from the library's instances (their count, or the first
    instance or keypoint without a match)."""
    stub = kpb_grpc.KeypointServiceStub(channel)
    settings = expected["settings"]
    differences = {}
    for photo, want in expected["expected"][model].items():
        request = kpb.DetectKeypointsRequest(
            image=image(zoo, expected, photo),
            model=model_pb2.ModelSpec(name=model),
            min_score=settings["min_score"],
            max_detections=settings["max_detections"],
        )
        result = stub.DetectKeypoints(request, timeout=TIMEOUT)
        size = expected["images"][photo]
        assert (result.image_width, result.image_height) == (size["width"], size["height"])
        assert [(e.start, e.end) for e in result.skeleton] == list(COCO17_SKELETON)
        limits = np.array([size["width"], size["height"]] * 2, dtype=np.float64)
        wanted = list(zip(want["classes"], want["scores"], want["boxes"], want["keypoints"],
                          strict=True))  # fmt: skip
        if len(result.instances) != len(wanted):
            differences[photo] = f"{len(result.instances)} instances, the library's {len(wanted)}"
            continue
        unmatched = list(result.instances)
        for class_id, score, box, points in wanted:
            clipped = np.clip(box, 0, limits)
            match = next((g for g in unmatched if _same(g, class_id, score, clipped)), None)
            if match is None:
                differences[photo] = f"no instance matches {(class_id, score, box)}"
                break
            unmatched.remove(match)
            problem = _point_difference(match, points)
            if problem:
                differences[photo] = problem
                break
    return differences


def _same(got: kpb.Instance, class_id: int, score: float, box: Any) -> bool:
    edges = (got.box.x_min, got.box.y_min, got.box.x_max, got.box.y_max)
    return (
        got.class_id == class_id
        and abs(got.score - score) <= DETECTION_SCORE_TOLERANCE
        and all(abs(a - b) <= BOX_TOLERANCE_PX for a, b in zip(edges, box, strict=True))
    )


def _point_difference(got: kpb.Instance, points: list[list[float]]) -> str:
    assert [p.name for p in got.keypoints] == list(COCO17_NAMES)
    for point, (x, y, score) in zip(got.keypoints, points, strict=True):
        if (
            abs(point.x - x) > POINT_TOLERANCE_PX
            or abs(point.y - y) > POINT_TOLERANCE_PX
            or abs(point.score - score) > POINT_SCORE_TOLERANCE
        ):
            return f"{point.name} at {(point.x, point.y, point.score)}; the library's {x, y, score}"
    return ""


@pytest.mark.parametrize("model", KEYPOINTERS)
def test_keypoints_are_ultralytics_within_a_pixel(
    model: str, zoo: Path, zoo_expected: dict[str, Any], channel: grpc.Channel
) -> None:
    expected = zoo_expected["expected"][model]
    # PNGs and JPEGs of several sizes and aspect ratios (the model stretches them to 320x320),
    # two EXIF-rotated (keypoints mapped into the image as shown)
    assert {"wide320x240", "tall200x300", "photo1200x900", "exif6_600x800",
            "exif3_800x600"} <= set(expected)  # fmt: skip
    # Random weights spread so that instances exist on every photo, each with its 17 points.
    assert all(len(found["scores"]) >= 3 for found in expected.values())
    assert keypoint_differences(channel, model, zoo, zoo_expected) == {}


@pytest.mark.parametrize("model", KEYPOINTERS)
def test_the_references_follow_the_image(model: str, zoo_expected: dict[str, Any]) -> None:
    expected = zoo_expected["expected"][model]
    first = {photo: np.asarray(found["keypoints"][0]) for photo, found in expected.items()}
    photos = sorted(first)
    for a, b in itertools.pairwise(photos):
        # Keypoints in the photos' own pixels: compared as fractions of each photo.
        size_a = [zoo_expected["images"][a][k] for k in ("width", "height")]
        size_b = [zoo_expected["images"][b][k] for k in ("width", "height")]
        moved = np.abs(first[a][:, :2] / size_a - first[b][:, :2] / size_b).max()
        assert moved > 0.05, (a, b)


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_wrong_preprocessing_fails_the_keypoints_comparison(
    mistake: str, zoo: Path, zoo_expected: dict[str, Any], tfs: LocalServer, tmp_path: Path
) -> None:
    config, changed = wrong_config(mistake, tmp_path, KEYPOINTERS)
    assert changed == list(KEYPOINTERS)
    args = [f"--model-config={config}", f"--model={DETECTORS[0]}"]
    with (
        run_gateway(tfs.target, args, log_dir=tmp_path) as gateway,
        grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
    ):
        for model in changed:
            differences = keypoint_differences(channel, model, zoo, zoo_expected)
            assert differences, f"{mistake}: {model} still matches the library"
