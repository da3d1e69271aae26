"""The model zoo: SavedModels made by the exporters people use, with random weights, and what
each gives when run directly in TensorFlow by its own library (tests/zoo/build.py).

Built by the exporters' venv (`.venv-zoo`, `make zoo-venv`) once per machine and content
(tests/zoo/cache.py: `make zoo`, the key being a hash of the builder's source and the venv's
pinned versions): a change to either builds the zoo again (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, run_local_server
from tests.zoo.cache import ZooBuildError, build_zoo

__all__ = ["build_zoo"]  # tests/zoo/deviation.py imports it from here


@pytest.fixture(scope="session")
def zoo() -> Path:
    try:
        return build_zoo()
    except ZooBuildError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def zoo_expected(zoo: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((zoo / "expected.json").read_text())
    return document


CLASSIFIERS = (
    "keras_mobilenetv3small_export",
    "keras_efficientnetb0_export",
    "tf_keras_resnet50_saved_model",
    "hf_vit",
    "hf_convnext",
    "mg_classifier",
    "keras_hub_resnet_classifier",
)
DETECTORS = (
    "mg_retinanet_image_tensor",
    "mg_retinanet_image_bytes",
    "mg_retinanet_tf_example",
    "mg_retinanet_image_tensor_normalized",
    "yolo_v8_layout",
    "keras_hub_retinanet_decoded",
)
EMBEDDERS = ("keras_mobilenetv3small_embedder", "hf_vit_embedder")
KEYPOINTERS = ("yolo_v8_pose_layout", "od_api_pose_layout")
# Every model the zoo's gateway can serve; REFUSED is the one it refuses.
SERVED = (*CLASSIFIERS, *DETECTORS, *EMBEDDERS, *KEYPOINTERS)
REFUSED = "keras_hub_retinanet"
MODEL_CONFIG = Path(__file__).with_name("models.toml")
LOAD_TIMEOUT = 1200.0


@pytest.fixture(scope="session")
def tfs(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("zoo-serving")
    entries = "".join(
        f"  config {{ name: '{name}' base_path: '{zoo / 'models' / name}' "
        "model_platform: 'tensorflow' }\n"
        for name in (*SERVED, REFUSED)
    )
    config = directory / "models.config"
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    # Eighteen models load one after another: about a minute on 2 idle cores, far more on a
    # busy machine.
    args = [f"--model_config_file={config}"]
    with run_local_server(args, timeout=LOAD_TIMEOUT, log_dir=directory) as server:
        yield server


@pytest.fixture(scope="session")
def gateway(tfs: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    args = [f"--model-config={MODEL_CONFIG}", f"--model={DETECTORS[0]}"]
    with run_gateway(tfs.target, args, log_dir=tmp_path_factory.mktemp("zoo-gateway")) as gw:
        yield gw


@pytest.fixture(scope="session")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel:
        yield channel
