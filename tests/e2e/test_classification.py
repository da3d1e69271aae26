"""Classification and fixed-size detection end to end: client -> gateway -> local TF Serving
-> the reference models, with the gateway's example model config (serving/gateway-models.toml).

The reference classifiers give each palette colour the share of pixels nearest to it, so the
truth for a generated image is known: its colour shares.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from serving.reference import CLASSIFIER_PALETTE, read_labels
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = ROOT / "serving" / "gateway-models.toml"
CLASSIFIERS = ("classifier", "classifier_scores", "classifier_logits")
LABELS = read_labels()
PALETTE = CLASSIFIER_PALETTE
# Inverse of the transposition ImageOps.exif_transpose applies for each orientation.
_UNDO = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


@pytest.fixture(scope="module")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving with every reference model (tests/conftest.py)."""
    return reference_serving


@pytest.fixture(scope="module")
def gateway(tfs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    args = [f"--model-config={MODEL_CONFIG}", "--max-pixels=10000000"]
    with run_gateway(tfs.target, args, log_dir=tmp_path_factory.mktemp("logs")) as gw:
        yield gw


@pytest.fixture(scope="module")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield channel


def striped(
    rng: np.random.Generator, width: int, height: int
) -> tuple[np.ndarray, dict[str, float]]:
    """Vertical stripes of 2-4 palette colours: the first covers 50-75 %, the second at most
    30 %, the rest share what is left. Returns the pixels and the exact colour shares."""
    colours = list(rng.permutation(LABELS))[: int(rng.integers(2, 5))]
    if len(colours) == 2:
        first = rng.uniform(0.7, 0.9)
        fractions = [first, 1 - first]
    else:
        first = rng.uniform(0.5, 0.75)
        second = min(rng.uniform(0.1, 0.3), 1 - first)
        rest = 1 - first - second
        fractions = [first, second] + [rest / (len(colours) - 2)] * (len(colours) - 2)
    columns = np.round(np.cumsum([0.0, *fractions]) * width).astype(int)
    pixels = np.zeros((height, width, 3), np.uint8)
    shares: dict[str, float] = {}
    for colour, start, end in zip(colours, columns[:-1], columns[1:], strict=True):
        pixels[:, start:end] = PALETTE[colour]
        shares[colour] = shares.get(colour, 0.0) + (end - start) / width
    return pixels, shares


def encode(pixels: np.ndarray, fmt: str, orientation: int) -> bytes:
    shown = Image.fromarray(pixels)
    stored = shown.transpose(_UNDO[orientation]) if orientation in _UNDO else shown
    out = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = orientation
    if fmt == "JPEG":
        stored.save(out, format="JPEG", quality=95, exif=exif.tobytes())
    else:
        stored.save(out, format="PNG", exif=exif.tobytes())
    return out.getvalue()


CASES = [(seed, fmt) for seed in range(6) for fmt in ("JPEG", "PNG")]


@pytest.mark.parametrize("model", CLASSIFIERS)
@pytest.mark.parametrize(("seed", "fmt"), CASES)
def test_classes_follow_the_colour_shares(channel, model, seed, fmt):
    rng = np.random.default_rng(seed * 31 + len(fmt))
    width, height = (int(v) for v in rng.integers(64, 3001, 2))
    orientation = int(rng.integers(1, 9))
    pixels, shares = striped(rng, width, height)
    stub = cpb_grpc.ClassificationServiceStub(channel)
    request = cpb.ClassifyRequest(
        image=encode(pixels, fmt, orientation), model=model_pb2.ModelSpec(name=model), top_k=8
    )
    result = stub.Classify(request, timeout=120)
    assert result.model.name == model and result.model.version == 1
    assert (result.image_width, result.image_height) == (width, height)
    truth = sorted(shares, key=shares.get, reverse=True)  # type: ignore[arg-type]
    top = result.classes[0]
    assert top.label == truth[0]
    assert top.class_id == LABELS.index(truth[0])
    if model == "classifier":  # label + confidence: the graph decides top-1 only
        assert len(result.classes) == 1
        assert top.score == pytest.approx(shares[truth[0]], abs=0.03)
        return
    got = {c.label: c.score for c in result.classes}
    for label, share in shares.items():
        assert got[label] == pytest.approx(share, abs=0.02), (label, got, shares)
    present = [c.label for c in result.classes if c.label in shares]
    assert present == sorted(present, key=lambda label: -shares[label])
    assert [c.score for c in result.classes] == sorted(
        (c.score for c in result.classes), reverse=True
    )


def test_classify_stream_answers_in_order_with_per_image_errors(channel):
    rng = np.random.default_rng(99)
    images = [encode(striped(rng, 200, 120)[0], "PNG", 1) for _ in range(3)]
    requests = [
        cpb.ClassifyRequest(image=images[0], request_id="a"),
        cpb.ClassifyRequest(image=b"\x89PNG broken", request_id="b"),
        cpb.ClassifyRequest(image=images[1], request_id="c", top_k=2),
    ]
    stub = cpb_grpc.ClassificationServiceStub(channel)
    results = list(stub.ClassifyStream(iter(requests), timeout=120))
    assert [r.request_id for r in results] == ["a", "b", "c"]
    assert results[0].model.name == "classifier" and len(results[0].classes) == 1
    assert results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert len(results[2].classes) == 1  # the default classifier returns its top-1 only


def test_a_detector_is_refused_by_the_classification_api(channel):
    stub = cpb_grpc.ClassificationServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Classify(
            cpb.ClassifyRequest(
                image=encode(np.zeros((8, 8, 3), np.uint8), "PNG", 1),
                model=model_pb2.ModelSpec(name="detector"),
            ),
            timeout=60,
        )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "configured as a detection model" in info.value.details()


@pytest.mark.parametrize(
    ("seed", "width", "height"), [(1, 640, 480), (2, 1000, 700), (3, 333, 500)]
)
def test_a_fixed_size_detector_returns_boxes_in_original_pixels(channel, seed, width, height):
    from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc

    rng = np.random.default_rng(seed)
    # Boxes large enough to survive the 320x320 resize (the detector needs 4 px sides).
    scene = scenes.generate_scene(rng, width, height, 4, min_side=max(width, height) // 8)
    stub = pb_grpc.DetectionServiceStub(channel)
    request = pb.DetectRequest(
        image=scenes.encode(scene.pixels, "PNG"), model=model_pb2.ModelSpec(name="detector_fixed")
    )
    result = stub.Detect(request, timeout=120)
    assert (result.image_width, result.image_height) == (width, height)
    assert len(result.detections) == len(scene.boxes)
    tolerance_x, tolerance_y = 2 * width / 320, 2 * height / 320
    for truth in scene.boxes:
        found = [d for d in result.detections if d.class_id == truth.class_id]
        assert found, f"{truth} not found in {result.detections}"
        best = min(
            found,
            key=lambda d: abs(d.box.x_min - truth.x_min) + abs(d.box.y_min - truth.y_min),
        )
        assert abs(best.box.x_min - truth.x_min) <= tolerance_x
        assert abs(best.box.x_max - truth.x_max) <= tolerance_x
        assert abs(best.box.y_min - truth.y_min) <= tolerance_y
        assert abs(best.box.y_max - truth.y_max) <= tolerance_y
        assert best.label == truth.label.replace("_", " ")


@pytest.mark.parametrize("service", ["detect", "classify"])
def test_a_stream_client_that_waits_for_each_answer_gets_it(channel, service):
    """Lockstep, as a video client that sends the next frame only after the last answer:
    every frame is answered while the client still holds its side of the stream open."""
    import queue

    from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc

    image = encode(striped(np.random.default_rng(5), 160, 90)[0], "PNG", 1)
    answered: queue.Queue[str] = queue.Queue()
    sent: list[str] = []

    def frames():
        for i in range(5):
            sent.append(str(i))
            if service == "detect":
                yield pb.DetectRequest(image=image, request_id=str(i))
            else:
                yield cpb.ClassifyRequest(image=image, request_id=str(i))
            # The next frame only after this one's answer (a hang would time out the call).
            assert answered.get(timeout=60) == str(i)

    if service == "detect":
        call = pb_grpc.DetectionServiceStub(channel).DetectStream(frames(), timeout=120)
    else:
        call = cpb_grpc.ClassificationServiceStub(channel).ClassifyStream(frames(), timeout=120)
    received = []
    for result in call:
        assert not result.HasField("error")
        received.append(result.request_id)
        answered.put(result.request_id)
    assert received == sent == ["0", "1", "2", "3", "4"]


def test_a_float_image_tensor_detector_gives_the_uint8_detectors_boxes(channel):
    """OD API float_image_tensor (float32 pixels 0..255) end to end: the same detections as
    the uint8 export of the same function, on a photo-like JPEG."""
    from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc

    scene = scenes.generate_scene(np.random.default_rng(11), 500, 380, 6, noise_sigma=4.0)
    image = scenes.encode(scene.pixels, "JPEG")
    stub = pb_grpc.DetectionServiceStub(channel)
    found = {}
    for name in ("detector", "detector_float"):
        request = pb.DetectRequest(image=image, model=model_pb2.ModelSpec(name=name))
        result = stub.Detect(request, timeout=120)
        assert result.model.name == name
        found[name] = [
            (d.class_id, d.label, d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max)
            for d in result.detections
        ]
    assert found["detector_float"] == found["detector"]
    assert len(found["detector"]) == len(scene.boxes)
