"""Calls to serving.local through the official tensorflow_serving.apis stubs, for the tests of
the local server (tests/serving): requests, the checks of their detections against the scenes'
painted rectangles, and the model configs, versions and client of the lifecycle tests."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving import scenes

BOX_TOLERANCE_PX = 1
OUTPUT_KEYS = {
    "detection_boxes",
    "detection_classes",
    "detection_multiclass_scores",
    "detection_scores",
    "num_detections",
    "raw_detection_boxes",
    "raw_detection_scores",
}
AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
END = get_model_status_pb2.ModelVersionStatus.END
WARMUP = Path("assets.extra/tf_serving_warmup_requests")


# ----- one request at a time (tests/serving/wire) -----------------------------------------------


def request_for(
    model: str, value: tensor_pb2.TensorProto | None = None, **spec: object
) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, item in spec.items():
        if key == "version":
            request.model_spec.version.value = int(item)
        else:
            setattr(request.model_spec, key, item)
    if value is not None:
        request.inputs["input_tensor"].CopyFrom(value)
    return request


def image_tensor(pixels: np.ndarray) -> tensor_pb2.TensorProto:
    """uint8 [1, H, W, 3] as tensor_content (what tf.make_tensor_proto writes)."""
    return tf.make_tensor_proto(pixels[np.newaxis])


def rpc_error(call: Callable[..., object], request: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, **kwargs)
    return info.value


def assert_finds(response: predict_pb2.PredictResponse, scene: scenes.Scene) -> None:
    """Every painted rectangle is found with its class, its box within 1 px; nothing else."""
    outputs = {key: tf.make_ndarray(value) for key, value in response.outputs.items()}
    count = int(outputs["num_detections"][0])
    assert count == len(scene.boxes)
    size = np.array([scene.height, scene.width, scene.height, scene.width])
    found = sorted(
        (int(c), *np.rint(b * size).astype(int).tolist())
        for b, c in zip(
            outputs["detection_boxes"][0][:count],
            outputs["detection_classes"][0][:count],
            strict=True,
        )
    )
    truth = sorted((t.class_id, t.y_min, t.x_min, t.y_max, t.x_max) for t in scene.boxes)
    for got, want in zip(found, truth, strict=True):
        assert got[0] == want[0]
        assert np.abs(np.array(got[1:]) - np.array(want[1:])).max() <= BOX_TOLERANCE_PX
    assert (outputs["detection_scores"][0][:count] > 0.5).all()
    assert (outputs["detection_scores"][0][count:] < 0.5).all()


def scene(seed: int, width: int = 320, height: int = 240, rects: int = 4) -> scenes.Scene:
    return scenes.generate_scene(np.random.default_rng(seed), width, height, rects, noise_sigma=4)


# ----- versions, configs and reloads (tests/serving/test_local_versions.py, ..._config.py) -----


def copy_model(source: Path, target: Path, versions: tuple[int, ...]) -> Path:
    """Copies the chosen version directories of one model; returns the new base path."""
    target.mkdir(parents=True)
    for version in versions:
        shutil.copytree(source / str(version), target / str(version))
    return target


def add_version(base: Path, source: Path, version: int) -> None:
    """Adds a version the way an exporter should: copy under a non-numeric name, rename."""
    staging = base / f".staging-{version}"
    shutil.copytree(source, staging)
    staging.rename(base / str(version))


def model_config(*models: str) -> str:
    return "model_config_list {\n" + "".join(f"  config {{ {m} }}\n" for m in models) + "}\n"


def detector_config(base: Path, extra: str = "") -> str:
    return f"name: 'detector' base_path: '{base}' model_platform: 'tensorflow' {extra}"


class Client:
    """The official stubs on one channel, with the few calls these tests need."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(channel)

    def predict(self, model: str = "detector", **spec: object) -> predict_pb2.PredictResponse:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        if "version" in spec:
            request.model_spec.version.value = int(spec["version"])
        if "version_label" in spec:
            request.model_spec.version_label = str(spec["version_label"])
        pixels = spec.get("pixels", np.zeros([1, 32, 32, 3], np.uint8))
        value = pixels if model == "detector" else np.array([scenes.encode(pixels[0])], object)
        request.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto(value))
        return self.prediction.Predict(request, timeout=60)

    def served_version(self, model: str = "detector", **spec: object) -> int:
        return int(self.predict(model, **spec).model_spec.version.value)

    def states(self, model: str = "detector") -> dict[int, int]:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        response = self.models.GetModelStatus(request, timeout=10)
        return {s.version: s.state for s in response.model_version_status}

    def error(self, model: str = "detector", **spec: object) -> tuple[str, str]:
        with pytest.raises(grpc.RpcError) as info:
            self.predict(model, **spec)
        return info.value.code().name, info.value.details()


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Polls `condition` (an RPC error counts as "not yet") until it holds."""
    deadline = time.monotonic() + timeout
    while not _holds(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _holds(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except grpc.RpcError:
        return False
