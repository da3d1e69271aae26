"""`make run` serves the other three tasks with its reference models (serving.segmenter,
serving.pose, serving.embedder), over gRPC and the HTTP door, on its sample pictures; and
every command its banner prints under "try:" runs as printed and answers.
"""

from __future__ import annotations

import io
import json
import subprocess

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from PIL import Image

from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.proto.embedding.v1 import embedding_pb2_grpc as epb_grpc
from gateway.proto.keypoints.v1 import keypoints_pb2 as kpb
from gateway.proto.keypoints.v1 import keypoints_pb2_grpc as kpb_grpc
from gateway.proto.segmentation.v1 import segmentation_pb2 as spb
from gateway.proto.segmentation.v1 import segmentation_pb2_grpc as spb_grpc
from gateway.tasks.keypoints.names import COCO17_NAMES
from serving import scenes
from serving.pose import FIGURE
from tests.support import masks, referencemodels
from tests.support.makerun import ROOT, MakeRun

pytestmark = pytest.mark.slow

# The samples are JPEGs: an edge may move a pixel.
TOLERANCE = 2


def shapes_truth() -> scenes.Scene:
    return scenes.shapes_scene(noise_sigma=4.0)


def boxes(instances: list[dict]) -> list[tuple[str, list[float]]]:
    return [
        (i["label"], [i["box"][k] for k in ("x_min", "y_min", "x_max", "y_max")]) for i in instances
    ]


def assert_boxes(found: list[tuple[str, list[float]]], scene: scenes.Scene) -> None:
    """One box per shape, each within TOLERANCE of the shape's box, with its colour's label."""
    assert len(found) == len(scene.boxes)
    for label, box in found:
        assert any(
            label == truth.label.replace("_", " ")
            and np.abs(np.subtract(box, [truth.x_min, truth.y_min, truth.x_max, truth.y_max])).max()
            <= TOLERANCE
            for truth in scene.boxes
        ), f"{label} {box} matches no shape of {scene.boxes}"


def test_segment(make_run: MakeRun, channel: grpc.Channel) -> None:
    image = make_run.samples["shapes"].read_bytes()
    stub = spb_grpc.SegmentationServiceStub(channel)
    result = stub.Segment(spb.SegmentRequest(image=image, mask_format="rle"), timeout=60)
    answer = json_format.MessageToDict(result, preserving_proto_field_name=True)
    scene = shapes_truth()
    assert_boxes(boxes(answer["instances"]), scene)
    shapes = scenes.shape_masks(scene.width, scene.height)
    for instance in answer["instances"]:
        class_id = instance["class_id"]
        # Each mask is its shape (ring with its hole, L without its corner) to a pixel or so.
        assert masks.iou(masks.decode(instance["mask"]), shapes[class_id]) >= 0.95, class_id
    over_http = make_run.post("/v1/models/maskrcnn:segment?mask_format=rle", image)
    assert boxes(over_http["instances"]) == boxes(answer["instances"])


def test_keypoints(make_run: MakeRun, channel: grpc.Channel) -> None:
    image = make_run.samples["shapes"].read_bytes()
    stub = kpb_grpc.KeypointServiceStub(channel)
    result = stub.DetectKeypoints(kpb.DetectKeypointsRequest(image=image), timeout=60)
    scene = shapes_truth()
    assert [i.label for i in result.instances] == ["person"] * 4
    for instance in result.instances:
        box = instance.box
        truth = next(
            b
            for b in scene.boxes
            if abs(b.x_min - box.x_min) <= TOLERANCE and abs(b.y_max - box.y_max) <= TOLERANCE
        )
        width, height = truth.x_max - truth.x_min, truth.y_max - truth.y_min
        # A stick figure standing in the shape's box (serving.pose.FIGURE), in its pixels.
        assert [k.name for k in instance.keypoints] == list(COCO17_NAMES)
        for point, (fx, fy) in zip(instance.keypoints, FIGURE, strict=True):
            assert abs(point.x - (truth.x_min + fx * width)) <= TOLERANCE + 1
            assert abs(point.y - (truth.y_min + fy * height)) <= TOLERANCE + 1
    over_http = make_run.post("/v1/models/pose:keypoints", image)
    assert [i["label"] for i in over_http["instances"]] == ["person"] * 4
    assert over_http["skeleton"]


def test_embed(make_run: MakeRun, channel: grpc.Channel) -> None:
    image = make_run.samples["scene"].read_bytes()
    stub = epb_grpc.EmbeddingServiceStub(channel)
    result = stub.Embed(epb.EmbedRequest(image=image), timeout=60)
    assert (result.dimension, result.normalized) == (48, True)
    vector = np.array(result.embedding)
    assert abs(np.linalg.norm(vector) - 1) < 1e-5
    # The picture's 4 x 4 thumbnail (the gateway's resize differs a little from Pillow's).
    pixels = (
        Image.open(io.BytesIO(image)).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)
    )
    want = referencemodels.embedder(np.asarray(pixels, np.float32)[None] / 255)[0]
    assert vector @ (want / np.linalg.norm(want)) > 0.999
    over_http = make_run.post("/v1/models/embedder:embed", image)
    np.testing.assert_allclose(over_http["embedding"], vector, atol=1e-6)


def banner_commands(banner: str) -> dict[str, str]:
    """The commands under "try:", by the task their comment line names ("  # keypoints (...)")."""
    commands = {}
    for block in banner[banner.index("\ntry:\n") + len("\ntry:\n") :].split("\n\n"):
        comment, _, command = block.strip("\n").partition("\n")
        if comment.startswith("  # ") and command:
            commands[comment[4:].split(" (")[0]] = command
    return commands


def test_every_banner_command_answers(make_run: MakeRun) -> None:
    commands = banner_commands(make_run.banner)
    assert list(commands) == [
        "detection",
        "classification",
        "instance segmentation",
        "keypoints",
        "embedding",
        "pipeline: detect, then classify each box's crop",
    ]
    boxes = len(scenes.sample_scene().boxes)
    expect = {
        "detection": lambda a: len(a["detections"]) == boxes,
        "classification": lambda a: len(a["classes"]) > 0,
        "instance segmentation": lambda a: len(a["instances"]) == 4,
        "keypoints": lambda a: len(a["instances"]) == 4,
        "embedding": lambda a: len(a["embedding"]) == 48,
        "pipeline: detect, then classify each box's crop": lambda a: (
            len(a["instances"]) == len(a["detections"]["detections"]) == boxes
            and all(i["steps"]["colour"]["classes"]["classes"] for i in a["instances"])
        ),
    }
    for task, command in commands.items():
        run = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, f"{task}: {command}\n{run.stderr}"
        answer = json.loads(run.stdout.splitlines()[0] if task == "classification" else run.stdout)
        assert expect[task](answer), f"{task}: {run.stdout[:2000]}"
