"""The zoo through the gateway: every export served by serving.local, called through a real
gateway process with tests/zoo/models.toml, and compared with the model run directly in
TensorFlow by its own library (tests/zoo/build.py): the same top-k and scores within 1e-3;
the same detections, boxes within 1 px of the original image, scores within 1e-3."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from PIL import Image

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from tests.support.gatewayproc import CHANNEL_OPTIONS, NOT_SERVING, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, run_local_server

# The first test builds the zoo when the cache has none (5 minutes on 2 idle cores, 25 on a
# busy machine) and starts the server that loads it: far over the suite's 300 s per test.
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(5400)]

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = Path(__file__).with_name("models.toml")
CLASSIFIERS = (
    "keras_mobilenetv3small_export",
    "keras_efficientnetb0_export",
    "tf_keras_resnet50_saved_model",
    "hf_vit",
    "mg_classifier",
    "keras_hub_resnet_classifier",
)
DETECTORS = (
    "mg_retinanet_image_tensor",
    "mg_retinanet_image_bytes",
    "mg_retinanet_tf_example",
    "mg_retinanet_image_tensor_normalized",
    "yolo_v8_layout",
)
REFUSED = "keras_hub_retinanet"
SCORE_TOLERANCE = 1e-3
BOX_TOLERANCE_PX = 1.0
TOP_K = 5
LOAD_TIMEOUT = 1200.0


@pytest.fixture(scope="module")
def tfs(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("zoo-serving")
    entries = "".join(
        f"  config {{ name: '{name}' base_path: '{zoo / 'models' / name}' "
        "model_platform: 'tensorflow' }\n"
        for name in (*CLASSIFIERS, *DETECTORS, REFUSED)
    )
    config = directory / "models.config"
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    # Thirteen models load one after another: about a minute on 2 idle cores, far more on a
    # busy machine.
    args = [f"--model_config_file={config}"]
    with run_local_server(args, timeout=LOAD_TIMEOUT, log_dir=directory) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(tfs: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    args = [f"--model-config={MODEL_CONFIG}", f"--model={DETECTORS[0]}"]
    with run_gateway(tfs.target, args, log_dir=tmp_path_factory.mktemp("zoo-gateway")) as gw:
        yield gw


@pytest.fixture(scope="module")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield channel


def image(zoo: Path, name: str) -> bytes:
    return (zoo / "images" / f"{name}.png").read_bytes()


@pytest.mark.parametrize("model", CLASSIFIERS)
def test_classifier_gives_the_librarys_top_k(
    model: str, zoo: Path, zoo_expected: dict[str, Any], channel: grpc.Channel
) -> None:
    stub = cpb_grpc.ClassificationServiceStub(channel)
    for photo, scores in zoo_expected["expected"][model].items():
        request = cpb.ClassifyRequest(
            image=image(zoo, photo), model=pb.ModelSpec(name=model), top_k=TOP_K
        )
        result = stub.Classify(request, timeout=120)
        got = [(c.class_id, c.score) for c in result.classes]
        assert len(got) == TOP_K
        for class_id, score in got:
            assert abs(score - scores[class_id]) <= SCORE_TOLERANCE, (model, class_id, score)
        # The same top-k: a class the library ranks higher can only be missing if it ties
        # (within the tolerance) with the lowest class returned.
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:TOP_K]
        lowest = min(score for _, score in got)
        for class_id in set(ranked) - {c for c, _ in got}:
            assert scores[class_id] <= lowest + SCORE_TOLERANCE, (model, ranked, got)
        assert got[0][0] == ranked[0] or abs(scores[got[0][0]] - scores[ranked[0]]) <= 1e-6


@pytest.mark.parametrize("model", DETECTORS)
def test_detector_gives_the_librarys_boxes(
    model: str, zoo: Path, zoo_expected: dict[str, Any], channel: grpc.Channel
) -> None:
    stub = pb_grpc.DetectionServiceStub(channel)
    settings = zoo_expected["settings"]
    for photo, expected in zoo_expected["expected"][model].items():
        request = pb.DetectRequest(
            image=image(zoo, photo),
            model=pb.ModelSpec(name=model),
            min_score=settings["min_score"],
            max_detections=settings["max_detections"],
        )
        result = stub.Detect(request, timeout=120)
        got = [
            (d.class_id, d.score, (d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max))
            for d in result.detections
        ]
        # Boxes are results within the image: the reference's are clipped to it, as the
        # gateway's are (a raw YOLO head's reach past the edges).
        width, height = Image.open(zoo / "images" / f"{photo}.png").size
        limits = np.array([width, height, width, height], dtype=np.float64)
        boxes = [np.clip(box, 0, limits).tolist() for box in expected["boxes"]]
        want = list(zip(expected["classes"], expected["scores"], boxes, strict=True))
        assert len(want) >= 3, f"{model}/{photo}: too few detections to compare"
        assert len(got) == len(want), (model, photo, got, want)
        unmatched = list(got)
        for class_id, score, box in want:
            match = next(
                (
                    g
                    for g in unmatched
                    if g[0] == class_id
                    and abs(g[1] - score) <= SCORE_TOLERANCE
                    and all(abs(a - b) <= BOX_TOLERANCE_PX for a, b in zip(g[2], box, strict=True))
                ),
                None,
            )
            assert match is not None, (model, photo, (class_id, score, box), unmatched)
            unmatched.remove(match)
        scores = [score for _, score, _ in got]
        assert scores == sorted(scores, reverse=True)


def test_the_anchor_based_keras_hub_head_is_refused_naming_what_to_export(
    zoo: Path, channel: grpc.Channel, gateway: GatewayProcess
) -> None:
    stub = pb_grpc.DetectionServiceStub(channel)
    request = pb.DetectRequest(image=image(zoo, "wide320x240"), model=pb.ModelSpec(name=REFUSED))
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
    assert set(reports) == {*CLASSIFIERS, *DETECTORS, REFUSED}
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
    while len(planned) + len(refused) < len(CLASSIFIERS) + len(DETECTORS) + 1:
        assert gateway.process.poll() is None and time.monotonic() < deadline, plan_lines()
        time.sleep(0.2)
        planned, refused = plan_lines()
    assert planned == {*CLASSIFIERS, *DETECTORS}
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
