"""The zoo through the gateway: every export served by serving.local, called through a real
gateway process with tests/zoo/models.toml, and compared with the model run directly in
TensorFlow by its own library with its documented preprocessing (tests/zoo/build.py), on PNGs
and JPEGs of several sizes, two EXIF-rotated: every class's score within 1e-4 and the same
top 5; the same detections, boxes within 1 px of the image as shown, scores within 1e-3
(tests/zoo/compare.py). tests/zoo/test_mistakes.py shows these comparisons fail when the
preprocessing is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support.gatewayproc import NOT_SERVING, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer
from tests.zoo.compare import classifier_differences, detector_differences, image
from tests.zoo.conftest import CLASSIFIERS, DETECTORS, MODEL_CONFIG, REFUSED, SERVED

# The first test builds the zoo when the cache has none (5 minutes on 2 idle cores, 25 on a
# busy machine) and starts the server that loads it: far over the suite's 300 s per test.
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(5400)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model", CLASSIFIERS)
def test_classifier_gives_the_librarys_scores(
    model: str, zoo: Path, zoo_expected: dict[str, Any], channel: grpc.Channel
) -> None:
    assert len(zoo_expected["expected"][model]) >= 8  # PNGs and JPEGs, two EXIF-rotated
    assert classifier_differences(channel, model, zoo, zoo_expected) == {}


@pytest.mark.parametrize("model", DETECTORS)
def test_detector_gives_the_librarys_boxes(
    model: str, zoo: Path, zoo_expected: dict[str, Any], channel: grpc.Channel
) -> None:
    photos = set(zoo_expected["expected"][model])
    # PNGs and JPEGs of several sizes (the YOLO head resizes them), two EXIF-rotated (boxes
    # mapped back into the image as shown; encoded exports decode the stored pixels)
    assert {"wide320x240", "photo1200x900", "exif6_600x800", "exif3_800x600"} <= photos
    assert detector_differences(channel, model, zoo, zoo_expected) == {}


def test_the_anchor_based_keras_hub_head_is_refused_naming_what_to_export(
    zoo: Path, zoo_expected: dict[str, Any], channel: grpc.Channel, gateway: GatewayProcess
) -> None:
    stub = pb_grpc.DetectionServiceStub(channel)
    data = image(zoo, zoo_expected, "wide320x240")
    request = pb.DetectRequest(image=data, model=model_pb2.ModelSpec(name=REFUSED))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Detect(request, timeout=120)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = caught.value.details()
    assert "anchor-based raw head (bbox_regression, cls_logits" in details
    assert "NMS in the graph" in details


def check_models(tfs: LocalServer, config: Path) -> tuple[int, dict[str, Any]]:
    """`python -m gateway check-models --json` against the zoo's server."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-models", "--json",
         f"--upstream={tfs.target}", f"--model-config={config}", f"--model={DETECTORS[0]}"],
        capture_output=True, timeout=600, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.stdout, done.stderr.decode(errors="replace")
    return done.returncode, json.loads(done.stdout)


def test_check_models_gives_each_plan_and_fails_for_the_model_it_cannot_serve(
    tfs: LocalServer,
) -> None:
    status, document = check_models(tfs, MODEL_CONFIG)
    reports = {r["model"]: r for r in document["models"]}
    assert status == 1 and not document["ok"]
    assert set(reports) == {*SERVED, REFUSED}
    assert [m for m, r in reports.items() if not r["ok"]] == [REFUSED]
    assert "anchor-based raw head" in reports[REFUSED]["error"]
    for report in reports.values():
        if report["ok"]:
            assert report["version"] == 1 and report["trial"]["version"] == 1
            assert report["signature"]["name"] == "serving_default"
    example = reports["mg_retinanet_tf_example"]
    assert example["input"]["encoding"] == "tf_example (image/encoded)"
    assert example["outputs"]["box_coordinates"] == "image_info"
    assert example["outputs"]["form"] == "TF Model Garden"
    assert reports["tf_keras_resnet50_saved_model"]["input"]["channel_order"] == "BGR"
    assert reports["tf_keras_resnet50_saved_model"]["outputs"]["probabilities"] == "predictions"
    assert reports["hf_vit"]["input"]["layout"] == "NCHW"
    filters = {m: r["input"].get("resize_filter", "") for m, r in reports.items() if r["ok"]}
    assert filters["tf_keras_resnet50_saved_model"].startswith("nearest (exact: full decode")
    assert filters["keras_hub_resnet_classifier"].startswith("tf-bilinear-antialias (exact")
    assert filters["mg_classifier"] == ""  # its graph resizes
    assert reports["keras_hub_resnet_classifier"]["outputs"]["form"] == "logits"
    assert reports["yolo_v8_layout"]["outputs"]["form"].startswith("yolo raw head")


def test_check_models_exits_0_when_every_model_can_be_served(
    tfs: LocalServer, tmp_path: Path
) -> None:
    text = MODEL_CONFIG.read_text()
    config = tmp_path / "models.toml"
    config.write_text(text[: text.index(f"[models.{REFUSED}]")])
    status, document = check_models(tfs, config)
    assert status == 0 and document["ok"], document


def test_the_gateway_logs_each_plan_and_the_refusal_at_startup(gateway: GatewayProcess) -> None:
    def plan_lines() -> tuple[set[str], list[dict[str, Any]]]:
        records = gateway.records()
        planned = {r["model"] for r in records if r.get("message") == "model plan"}
        refused = [r for r in records if r.get("message", "").startswith("model cannot be")]
        return planned, refused

    # The plans are logged in the background after the gateway starts listening: wait for
    # the last line (the models are planned in name order) or the gateway's exit.
    deadline = time.monotonic() + 300
    planned, refused = plan_lines()
    while len(planned) + len(refused) < len(SERVED) + 1:
        assert gateway.process.poll() is None and time.monotonic() < deadline, plan_lines()
        time.sleep(0.2)
        planned, refused = plan_lines()
    assert planned == set(SERVED)
    assert [r["model"] for r in refused] == [REFUSED]
    assert "anchor-based raw head" in refused[0]["error"]


def test_the_docs_show_the_config_of_every_exporter() -> None:
    docs = (ROOT / "docs" / "models.md").read_text()
    text = MODEL_CONFIG.read_text()
    sections = text[text.index("[models.") :].split("\n\n")
    for section in sections:
        assert section.strip() in docs, section


def test_a_tf_example_model_sent_bare_images_names_string_encoding(
    tfs: LocalServer, tmp_path: Path
) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        '[models.mg_retinanet_tf_example]\ntask = "detection"\n'
        '[models.mg_retinanet_tf_example.outputs]\nbox_coordinates = "image_info"\n'
        '[models.mg_retinanet_image_tensor]\ntask = "detection"\n'
        '[models.mg_retinanet_image_tensor.outputs]\nbox_coordinates = "image_info"\n'
    )
    status, document = check_models(tfs, config)
    reports = {r["model"]: r for r in document["models"]}
    assert status == 1
    error = reports["mg_retinanet_tf_example"]["error"]
    assert "the trial prediction failed (FAILED_PRECONDITION)" in error
    assert "set input.string_encoding = 'tf_example'" in error
    assert reports["mg_retinanet_image_tensor"]["ok"]


def test_a_default_model_the_gateway_cannot_serve_keeps_it_not_ready(
    tfs: LocalServer, tmp_path: Path
) -> None:
    args = [f"--model-config={MODEL_CONFIG}", f"--model={REFUSED}"]
    with run_gateway(tfs.target, args, log_dir=tmp_path, wait_ready=False) as gateway:
        deadline = time.monotonic() + 300
        while not gateway.readiness_changes():
            assert gateway.process.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        first = gateway.readiness_changes()[0]
        assert first["serving"] is False and first["model"] == REFUSED
        assert "anchor-based raw head" in first["reason"]
        assert gateway.health() == NOT_SERVING
