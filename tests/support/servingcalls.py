"""Calls to serving.local through the official tensorflow_serving.apis stubs, for the tests of
the local server (tests/serving): the model configs, versions and client of the lifecycle
tests."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving import scenes

AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
END = get_model_status_pb2.ModelVersionStatus.END
WARMUP = Path("assets.extra/tf_serving_warmup_requests")


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
