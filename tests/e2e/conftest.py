"""Fixtures for the operations tests: a real local TF Serving with the reference detector and
a tiny classifier, and the gateway's model config for both.

The classifier (`colours`) is exported here with TensorFlow: uint8 pixels [1,H,W,3] in,
`probabilities` [1,3] out = each channel's share of the image's mean colour, so a pure red
image is class 0 ("red") with probability 1. It exists so Classify reaches TF Serving.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support import pipelinesetup
from tests.support.browser import browser  # noqa: F401 (a fixture: headless chromium)
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, run_local_server

CLASSIFIER = "colours"
MODEL_CONFIG = """\
[defaults]
detection = "detector"
classification = "colours"

[models.detector]
task = "detection"

[models.colours]
task = "classification"
labels = "colours.txt"
top_k = 3
"""


def export_colour_classifier(base: Path) -> Path:
    """Writes <base>/1 (a SavedModel); returns base."""
    import tensorflow as tf

    class Colours(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, None, None, 3], tf.uint8)])
        def serve(self, input_tensor: tf.Tensor) -> dict[str, tf.Tensor]:
            means = tf.reduce_mean(tf.cast(input_tensor, tf.float32), axis=[1, 2]) + 1e-3
            return {"probabilities": means / tf.reduce_sum(means, axis=1, keepdims=True)}

    module = Colours()
    tf.saved_model.save(module, str(base / "1"), signatures={"serving_default": module.serve})
    return base


@pytest.fixture(scope="session")
def ops_models(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TF Serving model config naming `detector` and `colours`."""
    root = tmp_path_factory.mktemp("ops-models")
    export_colour_classifier(root / CLASSIFIER)
    config = root / "models.config"
    entries = "".join(
        f"  config {{ name: '{name}' base_path: '{path}' model_platform: 'tensorflow' }}\n"
        for name, path in (("detector", model_repo / "detector"), (CLASSIFIER, root / CLASSIFIER))
    )
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    return config


@pytest.fixture(scope="session")
def gateway_model_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gateway's --model-config for `detector` and `colours`."""
    root = tmp_path_factory.mktemp("gateway-models")
    (root / "colours.txt").write_text("red\ngreen\nblue\n")
    path = root / "models.toml"
    path.write_text(MODEL_CONFIG)
    return path


@pytest.fixture(scope="session")
def tfs_ops(ops_models: Path) -> Iterator[LocalServer]:
    """A real local TF Serving with `detector` and `colours`, version 1 each."""
    with run_local_server([f"--model_config_file={ops_models}"]) as server:
        yield server


@pytest.fixture(scope="session")
def pipeline_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model config of the pipelines' tests (tests/support/pipelinesetup.py)."""
    return pipelinesetup.write_config(tmp_path_factory.mktemp("pipelines") / "models.toml")


@pytest.fixture(scope="session")
def pipeline_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset of three scenes (PNG) for the pipelines' batch jobs."""
    return pipelinesetup.write_dataset(tmp_path_factory.mktemp("pipeline-images"))


@pytest.fixture(scope="session")
def pipeline_gateway(
    reference_serving: LocalServer,
    pipeline_config: Path,
    pipeline_images: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """A gateway with the pipelines, both doors, a payload log of every call (its
    payloads.jsonl beside its log) and batch jobs that may read `pipeline_images`."""
    logs = tmp_path_factory.mktemp("pipeline-logs")
    (logs / "paylog.toml").write_text("[default]\nrate = 1.0\n")
    args = [f"--model-config={pipeline_config}", f"--payload-log={logs / 'payloads.jsonl'}",
            f"--payload-log-config={logs / 'paylog.toml'}", f"--job-store={logs / 'jobs'}",
            f"--batch-allowed-input-uris={pipeline_images}",
            "--batch-allow-anonymous=true"]  # fmt: skip
    with run_gateway(reference_serving.target, args, log_dir=logs, http=True) as gateway:
        yield gateway


@pytest.fixture(scope="session")
def pipeline_channel(pipeline_gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(pipeline_gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield channel
