"""The seven reference models served by serving.local, through the official stubs.

Classifiers: generated images of colour bands (sizes 64-3000 px, JPEG and PNG) against the
shares of palette colours computed here in numpy (nearest palette colour, float64) on the
original pixels. Detectors: the fixed-size and float forms against the painted rectangles and
against `detector`. Metadata: every model's SignatureDef as TF Serving describes it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving import scenes, warmup
from serving.reference import CLASSIFIER_PALETTE, REFERENCE_MODELS
from tests.support import referencemodels
from tests.support.facts import fact, text
from tests.support.localserver import LocalServer, run_local_server

LABELS = list(CLASSIFIER_PALETTE)
PALETTE = np.array(list(CLASSIFIER_PALETTE.values()), dtype=np.float64)
SIZE = 224
# Shares after decoding and resizing stay this close to those of the original image. Band
# edges sit on 16-px JPEG blocks (no JPEG colour error: measured 0.0000), and each of the at
# most two band edges blends about one of the 224 resized rows (measured worst 0.004 over 40
# random images of 64-3000 px).
SHARE_TOLERANCE = 0.02


@pytest.fixture(scope="module")
def tfs(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("reference-models")
    config = directory / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f"  config {{ name: '{name}' base_path: '{model_repo / name}' "
            "model_platform: 'tensorflow' }\n"
            for name in REFERENCE_MODELS
        )
        + "}\n"
    )
    with run_local_server([f"--model_config_file={config}"], log_dir=directory) as server:
        yield server


@pytest.fixture(scope="module")
def stub(tfs: LocalServer) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with tfs.channel() as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def predict(stub, model: str, alias: str, value: np.ndarray) -> dict[str, np.ndarray]:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    response = stub.Predict(request, timeout=120)
    assert response.model_spec.name == model and response.model_spec.version.value == 1
    return {key: tf.make_ndarray(proto) for key, proto in response.outputs.items()}


def predict_error(stub, model: str, alias: str, value: np.ndarray) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        predict(stub, model, alias, value)
    return info.value


def true_shares(pixels: np.ndarray) -> np.ndarray:
    """Share of pixels whose nearest palette colour (Euclidean RGB) is each class."""
    flat = pixels.reshape(-1, 3)
    palette = PALETTE / 255.0 * _scale(pixels)
    counts = np.zeros(len(PALETTE), dtype=np.int64)
    for start in range(0, len(flat), 1 << 20):  # 1 Mpixel at a time: 9 MP images stay small
        chunk = flat[start : start + (1 << 20), np.newaxis, :].astype(np.float64)
        nearest = ((chunk - palette) ** 2).sum(axis=-1).argmin(axis=1)
        counts += np.bincount(nearest, minlength=len(PALETTE))
    return counts / len(flat)


def _scale(pixels: np.ndarray) -> float:
    """255 for uint8 images, 1 for float images in [0, 1]."""
    return 255.0 if pixels.dtype == np.uint8 else 1.0


def decoded_and_resized(encoded: bytes) -> np.ndarray:
    """What a gateway sends `classifier_scores`: the image decoded, resized to 224x224
    (Pillow bilinear, antialiased when shrinking) and rescaled to float32 [0, 1]."""
    with Image.open(io.BytesIO(encoded)) as image:
        resized = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.asarray(resized, dtype=np.float32) / np.float32(255.0)


def vit_pixel_values(image01: np.ndarray) -> np.ndarray:
    """A ViT image processor's output for one [224, 224, 3] image in [0, 1]: NCHW,
    (x - 0.5)/0.5."""
    return ((image01 - 0.5) / 0.5).transpose(2, 0, 1)[np.newaxis].astype(np.float32)


def _cases() -> list[tuple[int, int, int, str, int, float]]:
    """(seed, width, height, format, colours, dominant share): the extremes of 64-3000 px
    first, then random sizes."""
    rng = np.random.default_rng(20261123)
    cases = []
    corners = [(64, 64), (3000, 3000), (64, 3000), (3000, 64)]
    for index in range(12):
        width, height = (
            corners[index] if index < 4 else (int(v) for v in rng.integers(64, 3001, size=2))
        )
        colours = 2 if index % 3 == 0 else 3
        # Two colours: the second must stay <= 30 %, so the first takes >= 70 %.
        dominant = float(rng.uniform(0.72, 0.9) if colours == 2 else rng.uniform(0.55, 0.85))
        fmt = "JPEG" if index % 2 else "PNG"
        cases.append((index, width, height, fmt, colours, dominant))
    return cases


CASES = _cases()


def colour_image(case: tuple[int, int, int, str, int, float]) -> tuple[np.ndarray, bytes]:
    seed, width, height, fmt, colours, dominant = case
    rng = np.random.default_rng(seed)
    noise = 6.0 if seed % 4 < 2 else 0.0
    image = scenes.generate_colour_image(
        rng, width, height, CLASSIFIER_PALETTE, colours, dominant, noise_sigma=noise
    )
    return image.pixels, scenes.encode(image.pixels, "JPEG" if fmt == "JPEG" else "PNG")


def dominant_of(shares: np.ndarray) -> str:
    """The dominant class, after checking the image is one the test is meant for."""
    first, second = np.sort(shares)[::-1][:2]
    assert first >= 0.5 and second <= 0.3, f"test image has shares {first:.3f}, {second:.3f}"
    return LABELS[int(np.argmax(shares))]


def case_id(case: tuple[int, int, int, str, int, float]) -> str:
    return f"{case[1]}x{case[2]}-{case[3]}"


# ----- classifiers ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_classifier_decodes_and_resizes_in_the_graph(stub, case):
    pixels, encoded = colour_image(case)
    truth = true_shares(pixels)
    outputs = predict(stub, "classifier", "string_input", np.array([warmup.base64url(encoded)]))
    assert outputs["label"].shape == outputs["confidence"].shape == (1,)
    assert outputs["label"][0].decode() == dominant_of(truth)
    # The graph resizes to 224x224 like Pillow's antialiased bilinear resize: the top share
    # matches that image's share, and the original's within SHARE_TOLERANCE.
    resized = true_shares(decoded_and_resized(encoded))
    assert abs(outputs["confidence"][0] - resized.max()) <= 0.005
    assert abs(outputs["confidence"][0] - truth.max()) <= SHARE_TOLERANCE


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_scores_and_logits_classifiers_give_the_colour_shares(stub, case):
    pixels, encoded = colour_image(case)
    truth = true_shares(pixels)
    image01 = decoded_and_resized(encoded)

    probabilities = predict(stub, "classifier_scores", "input_tensor", image01[np.newaxis])
    scores = probabilities["probabilities"]
    assert scores.shape == (1, 8) and scores.dtype == np.float32
    # Exactly the shares of the tensor it was given (counts over 224*224 pixels)...
    np.testing.assert_allclose(scores[0], true_shares(image01), atol=1e-6)
    # ...which are those of the original image within the tolerance.
    assert np.abs(scores[0] - truth).max() <= SHARE_TOLERANCE
    assert LABELS[int(np.argmax(scores[0]))] == dominant_of(truth)
    assert scores.sum() == pytest.approx(1.0, abs=1e-6)

    logits = predict(stub, "classifier_logits", "pixel_values", vit_pixel_values(image01))
    assert logits["logits"].shape == (1, 8)
    softmax = tf.nn.softmax(logits["logits"].astype(np.float64)).numpy()
    np.testing.assert_allclose(softmax[0], scores[0], atol=1e-6)
    floor = np.log(np.maximum(scores[0], 1e-9))
    np.testing.assert_allclose(logits["logits"][0], floor, rtol=1e-5, atol=1e-5)


def test_an_image_that_is_70_percent_blue_scores_blue_070(stub):
    pixels = np.zeros((200, 100, 3), dtype=np.uint8)  # black
    pixels[:140] = CLASSIFIER_PALETTE["blue"]
    pixels[140:170] = (250, 250, 10)  # nearest to yellow
    encoded = scenes.encode(pixels, "PNG")
    outputs = predict(stub, "classifier", "string_input", np.array([warmup.base64url(encoded)]))
    assert outputs["label"].tolist() == [b"blue"]
    assert outputs["confidence"][0] == pytest.approx(0.70, abs=0.01)
    scores = predict(stub, "classifier_scores", "input_tensor", decoded_and_resized(encoded)[None])
    expected = dict.fromkeys(LABELS, 0.0) | {"blue": 0.70, "yellow": 0.15, "black": 0.15}
    np.testing.assert_allclose(scores["probabilities"][0], list(expected.values()), atol=0.01)


def test_classifier_takes_a_batch_padded_or_not_in_jpeg_png_gif_and_bmp(stub):
    pixels, _ = colour_image(CASES[5])
    expected = dominant_of(true_shares(pixels))
    small = scenes.resize(pixels, 300, 200)
    images = []
    for fmt in ("PNG", "JPEG", "GIF", "BMP"):
        buffer = io.BytesIO()
        Image.fromarray(small).save(buffer, format=fmt)
        images.append(buffer.getvalue())
    # Each image with and without its '=' padding (at least one has padding to drop).
    assert any(len(data) % 3 for data in images)
    values = [warmup.base64url(data, padding) for data in images for padding in (True, False)]
    outputs = predict(stub, "classifier", "string_input", np.array(values, dtype=object))
    assert [label.decode() for label in outputs["label"]] == [expected] * 8
    confidence = outputs["confidence"]
    np.testing.assert_array_equal(confidence[0::2], confidence[1::2])  # padding changes nothing
    assert np.ptp(confidence) <= 0.01  # GIF's palette and JPEG barely move the shares


def test_standard_base64_is_refused_by_the_graph(stub):
    _, encoded = colour_image(CASES[0])
    import base64

    standard = base64.b64encode(encoded)
    assert b"+" in standard or b"/" in standard
    error = predict_error(stub, "classifier", "string_input", np.array([standard]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("Invalid character found in base64.")


@pytest.mark.parametrize(
    ("model", "alias", "shape", "dtype", "declared"),
    [
        ("classifier_scores", "input_tensor", (1, 200, 224, 3), np.float32, "[-1,224,224,3]"),
        ("classifier_scores", "input_tensor", (2, 224, 224), np.float32, "[-1,224,224,3]"),
        ("classifier_logits", "pixel_values", (1, 224, 224, 3), np.float32, "[-1,3,224,224]"),
        ("detector_fixed", "input_tensor", (1, 240, 320, 3), np.uint8, "[-1,320,320,3]"),
    ],
    ids=["scores-height", "scores-rank", "logits-nhwc", "fixed-detector-size"],
)
def test_a_wrong_shape_fails_in_the_model_with_invalid_argument(
    stub, model, alias, shape, dtype, declared
):
    """TF Serving checks no shapes (FACTS.md); the fixed-size models check their own input,
    so the error is TensorFlow's Assert text, not the Python client's 'Cannot feed value'."""
    error = predict_error(stub, model, alias, np.zeros(shape, dtype=dtype))
    got = " ".join(str(size) for size in shape)
    code, message = fact("model_shape_check", alias=alias, shape=declared, sent_dims=got)
    assert error.code().name == code
    assert error.details().startswith(message)
    assert "Cannot feed value" not in error.details()


# ----- the fixed-size and float detectors -----------------------------------------------------


def detections(outputs: dict[str, np.ndarray], size: tuple[int, int]) -> list[tuple[int, ...]]:
    count = int(outputs["num_detections"][0])
    height, width = size
    boxes = outputs["detection_boxes"][0][:count] * np.array([height, width, height, width])
    classes = outputs["detection_classes"][0][:count]
    return sorted(
        (int(c), *np.rint(b).astype(int).tolist()) for b, c in zip(boxes, classes, strict=True)
    )


def test_fixed_size_detector_gives_boxes_on_its_320_grid(stub):
    scene = scenes.generate_scene(np.random.default_rng(11), 320, 320, 6, noise_sigma=4)
    outputs = predict(stub, "detector_fixed", "input_tensor", scene.pixels[np.newaxis])
    assert outputs["detection_boxes"].shape == (1, 100, 4)
    count = int(outputs["num_detections"][0])
    assert count == len(scene.boxes) >= 3
    grid = outputs["detection_boxes"][0][:count] * 320
    np.testing.assert_allclose(grid, np.rint(grid), atol=1e-3)  # whole pixels of 320x320
    truth = sorted((t.class_id, t.y_min, t.x_min, t.y_max, t.x_max) for t in scene.boxes)
    for got, want in zip(detections(outputs, (320, 320)), truth, strict=True):
        assert got[0] == want[0]
        assert np.abs(np.array(got[1:]) - np.array(want[1:])).max() <= 1


def test_fixed_size_detector_equals_detector_on_a_320_image(stub):
    scene = scenes.generate_scene(np.random.default_rng(12), 320, 320, 5, noise_sigma=6)
    fixed = predict(stub, "detector_fixed", "input_tensor", scene.pixels[np.newaxis])
    free = predict(stub, "detector", "input_tensor", scene.pixels[np.newaxis])
    assert set(fixed) == set(free)
    for key in ("num_detections", "detection_classes"):
        np.testing.assert_array_equal(fixed[key], free[key], err_msg=key)
    # The same detections; with the size known, TensorFlow's optimizer may divide by 320
    # as a multiplication by 1/320, one float32 ulp away.
    for key, value in free.items():
        np.testing.assert_allclose(fixed[key], value, rtol=0, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("size", [(240, 320), (577, 1003)])
def test_float_detector_equals_uint8_detector_on_the_same_pixels(stub, size):
    height, width = size
    scene = scenes.generate_scene(np.random.default_rng(width), width, height, 6, noise_sigma=8)
    uint8 = predict(stub, "detector", "input_tensor", scene.pixels[np.newaxis])
    floats = predict(
        stub, "detector_float", "input_tensor", scene.pixels[np.newaxis].astype(np.float32)
    )
    assert set(floats) == set(uint8)
    for key, value in uint8.items():
        np.testing.assert_array_equal(floats[key], value, err_msg=key)
    assert int(floats["num_detections"][0]) == len(scene.boxes) > 0


def test_float_detector_refuses_uint8_with_tensorflows_dtype_error(stub):
    error = predict_error(stub, "detector_float", "input_tensor", np.zeros((1, 8, 8, 3), np.uint8))
    code, message = fact("wrong_dtype", index=0, signature_dtype="float", sent_dtype="uint8")
    assert error.code().name == code
    assert error.details().startswith(message)


# ----- metadata -------------------------------------------------------------------------------

# What each model's serving_default declares: alias -> (dtype, shape), inputs then outputs.
_OD_OUTPUTS = {
    "detection_boxes": [100, 4],
    "detection_classes": [100],
    "detection_multiclass_scores": [100, 5],
    "detection_scores": [100],
    "num_detections": [],
    "raw_detection_boxes": [200, 4],
    "raw_detection_scores": [200, 5],
}


def _od(dtype: int, shape: list[int], batch: int) -> tuple[dict, dict]:
    outputs = {k: (types_pb2.DT_FLOAT, [batch, *v]) for k, v in _OD_OUTPUTS.items()}
    return {"input_tensor": (dtype, shape)}, outputs


EXPECTED_SIGNATURES = {
    "detector": _od(types_pb2.DT_UINT8, [1, -1, -1, 3], 1),
    "detector_encoded": _od(types_pb2.DT_STRING, [-1], -1),
    "detector_fixed": _od(types_pb2.DT_UINT8, [1, 320, 320, 3], 1),
    "detector_float": _od(types_pb2.DT_FLOAT, [1, -1, -1, 3], 1),
    "classifier": (
        {"string_input": (types_pb2.DT_STRING, [-1])},
        {"label": (types_pb2.DT_STRING, [-1]), "confidence": (types_pb2.DT_FLOAT, [-1])},
    ),
    "classifier_scores": (
        {"input_tensor": (types_pb2.DT_FLOAT, [-1, 224, 224, 3])},
        {"probabilities": (types_pb2.DT_FLOAT, [-1, 8])},
    ),
    "classifier_logits": (
        {"pixel_values": (types_pb2.DT_FLOAT, [-1, 3, 224, 224])},
        {"logits": (types_pb2.DT_FLOAT, [-1, 8])},
    ),
    **referencemodels.SIGNATURES,  # the segmenter, the keypoint model, the embedder
}


def _described(infos) -> dict[str, tuple[int, list[int]]]:
    return {
        alias: (info.dtype, [dim.size for dim in info.tensor_shape.dim])
        for alias, info in infos.items()
    }


@pytest.mark.parametrize("name", list(REFERENCE_MODELS))
def test_metadata_describes_each_signature_as_tf_serving_does(stub, model_repo, name):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = name
    response = stub.GetModelMetadata(request, timeout=30)
    assert (response.model_spec.name, response.model_spec.version.value) == (name, 1)
    assert not response.model_spec.signature_name
    any_value = response.metadata["signature_def"]
    assert any_value.type_url == text("metadata_type_url")
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert any_value.Unpack(signatures)
    assert set(signatures.signature_def) == {"serving_default", "__saved_model_init_op"}
    signature = signatures.signature_def["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"
    inputs, outputs = EXPECTED_SIGNATURES[name]
    assert _described(signature.inputs) == inputs
    assert _described(signature.outputs) == outputs
    # Exactly the SignatureDef of the exported saved_model.pb.
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((model_repo / name / "1" / "saved_model.pb").read_bytes())
    assert signature == saved_model.meta_graphs[0].signature_def["serving_default"]


def test_every_model_ran_its_warmup_records_at_load(tfs, model_repo):
    log = tfs.log_text()
    for name in REFERENCE_MODELS:
        path = model_repo / name / "1" / "assets.extra" / warmup.WARMUP_FILENAME
        count = len(warmup.read_warmup_file(path))
        finished = text("warmup_finished", path=path, count=count, micros="")
        assert finished[: finished.index(" Elapsed")] in log, name
