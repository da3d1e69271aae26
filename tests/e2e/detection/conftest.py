"""End to end over real sockets: client -> gateway -> local TF Serving -> reference models.

One local TF Serving-compatible server and one gateway serve every test of this package (started
once for the package, not per file): `detector` (versions 1 and 2, labels stable=1 and
canary=2), `detector_encoded`, and `vector_model`, a SavedModel with a signature no task can use (a
float vector in, probabilities out). `recording` is a proxy to that server that keeps every
Predict; `windowed` (a stream window of STREAM_WINDOW) and `scaled_stub` (the example model
config, max_side 1024) are gateways behind it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.export import export_models
from tests.support.detections import (
    EXAMPLE_MODEL_CONFIG,
    MAX_IMAGE_BYTES,
    MAX_PIXELS,
    MODELS,
    STREAM_WINDOW,
    RecordingUpstream,
)
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import run_local_server


def _save_classifier(path: Path) -> None:
    import tensorflow as tf

    class Classifier(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])
        def __call__(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"probabilities": tf.nn.softmax(features)}

    module = Classifier()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})


@pytest.fixture(scope="package")
def model_config(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e-models")
    shutil.copytree(model_repo, root, dirs_exist_ok=True)
    export_models(root, version=2, names=["detector"])
    _save_classifier(root / "vector_model" / "1")  # not a reference model's name
    config = root / "models.config"
    config.write_text(
        f"""
        model_config_list {{
          config {{
            name: 'detector' base_path: '{root / "detector"}' model_platform: 'tensorflow'
            model_version_policy {{ all {{}} }}
            version_labels {{ key: 'stable' value: 1 }}
            version_labels {{ key: 'canary' value: 2 }}
          }}
          config {{
            name: 'detector_encoded' base_path: '{root / "detector_encoded"}'
            model_platform: 'tensorflow'
          }}
          config {{
            name: 'vector_model' base_path: '{root / "vector_model"}' model_platform: 'tensorflow'
          }}
        }}
        """
    )
    return config


def label_map_flag(model_config: Path) -> str:
    root = model_config.parent
    return "--label-maps=" + ",".join(
        f"{m}={root / m / '1' / 'assets.extra' / 'label_map.pbtxt'}" for m in MODELS
    )


@pytest.fixture(scope="package")
def tfs(model_config: Path) -> Iterator[object]:
    args = [f"--model_config_file={model_config}", "--allow_version_labels_for_unavailable_models"]
    with run_local_server(args) as server:
        yield server


@pytest.fixture(scope="package")
def gateway(tfs, model_config: Path, tmp_path_factory) -> Iterator[GatewayProcess]:
    args = [
        label_map_flag(model_config),
        f"--max-pixels={MAX_PIXELS}",
        f"--max-image-bytes={MAX_IMAGE_BYTES}",
        f"--stream-window={STREAM_WINDOW}",
    ]
    with run_gateway(tfs.target, args, log_dir=tmp_path_factory.mktemp("logs")) as gw:
        yield gw


@pytest.fixture(scope="package")
def stub(gateway: GatewayProcess):
    with gateway.channel() as channel:
        yield gateway.stub(channel)


@pytest.fixture(scope="package")
def recording(tfs) -> Iterator[RecordingUpstream]:
    with RecordingUpstream(tfs.target) as upstream:
        yield upstream


@pytest.fixture(scope="package")
def scaled_stub(recording: RecordingUpstream, tmp_path_factory) -> Iterator[object]:
    """A gateway with the example model config (serving/gateway-models.toml: max_side 1024
    for the reference detectors), calling TF Serving through `recording`."""
    args = [f"--model-config={EXAMPLE_MODEL_CONFIG}"]
    logs = tmp_path_factory.mktemp("scaled-logs")
    with run_gateway(recording.target, args, log_dir=logs) as gw, gw.channel() as channel:
        yield gw.stub(channel)


@pytest.fixture(scope="package")
def windowed(recording: RecordingUpstream, tmp_path_factory) -> Iterator[GatewayProcess]:
    """A gateway with a stream window of STREAM_WINDOW, calling TF Serving via `recording`."""
    args = [f"--stream-window={STREAM_WINDOW}"]
    logs = tmp_path_factory.mktemp("windowed-logs")
    with run_gateway(recording.target, args, log_dir=logs) as gw:
        yield gw
