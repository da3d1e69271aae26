"""`make run` (tools/devrun.py through the Makefile's `run` target) comes up and answers: one
call per task over gRPC and over the HTTP door, on the sample pictures it writes, whose
painted rectangles and shapes the reference models find (detection and classification here,
the other three tasks and the banner's commands in test_devrun_tasks.py).

A launcher that fails to start (the ModuleNotFoundError of issue 43) fails these tests: the
`make_run` fixture raises with make's output when make exits before its banner.
"""

from __future__ import annotations

import io

import grpc
import numpy as np
import pytest
from PIL import Image

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as dpb
from gateway.proto.detection.v1 import detection_pb2_grpc as dpb_grpc
from serving.reference import CLASSIFIER_PALETTE, REFERENCE_MODELS, read_labels
from serving.scenes import sample_scene
from tests.support.detections import assert_matches
from tests.support.makerun import MakeRun

pytestmark = pytest.mark.slow

# The sample is a JPEG: its edges may move a pixel.
TOLERANCE = 2


def test_banner_names_every_port_model_and_sample(make_run: MakeRun) -> None:
    banner = make_run.banner
    for port in make_run.ports.values():
        assert f"localhost:{port}" in banner
    assert set(make_run.samples) == {"scene", "shapes"}
    for sample in make_run.samples.values():
        assert str(sample) in banner
    for model in REFERENCE_MODELS:
        assert model in banner


def test_detect(make_run: MakeRun, channel: grpc.Channel) -> None:
    image = make_run.samples["scene"].read_bytes()
    stub = dpb_grpc.DetectionServiceStub(channel)
    result = stub.Detect(dpb.DetectRequest(image=image), timeout=60)
    assert_matches(result, sample_scene(), TOLERANCE)
    answer = make_run.post("/v1/models/detector:detect?min_score=0.5", image)
    over_http = [(d["label"], d["box"]) for d in answer["detections"]]
    over_grpc = [
        (d.label, {k: getattr(d.box, k) for k in ("x_min", "y_min", "x_max", "y_max")})
        for d in result.detections
        if d.score >= 0.5
    ]
    assert over_http == over_grpc


def test_classify(make_run: MakeRun, channel: grpc.Channel) -> None:
    image = make_run.samples["scene"].read_bytes()
    stub = cpb_grpc.ClassificationServiceStub(channel)
    # The classifiers answer the palette colour nearest to most pixels (serving.classifier).
    pixels = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"), np.float32)
    palette = np.array(list(CLASSIFIER_PALETTE.values()), np.float32)
    nearest = np.argmin(((pixels[..., None, :] - palette) ** 2).sum(-1), axis=-1)
    majority = read_labels()[np.bincount(nearest.ravel(), minlength=len(palette)).argmax()]
    for model in ("classifier", "classifier_scores", "classifier_logits"):
        request = cpb.ClassifyRequest(image=image, top_k=3)
        request.model.name = model
        result = stub.Classify(request, timeout=60)
        assert result.classes[0].label == majority
        answer = make_run.post(f"/v1/models/{model}:classify?top_k=3", image)
        assert [c["label"] for c in answer["classes"]] == [c.label for c in result.classes]
