"""The model zoo: SavedModels made by the exporters people use, with random weights, and what
each gives when run directly in TensorFlow by its own library (tests/zoo/build.py).

Built by the exporters' venv (`.venv-zoo`, `make zoo-venv`) and cached under `.cache/zoo/<key>`
(gitignored), the key being a hash of the builder's source and the venv's pinned versions
(constraints-zoo.txt): a change to either builds the zoo again (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support import tools
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, run_local_server

ROOT = Path(__file__).resolve().parents[2]
BUILDER = Path(__file__).with_name("build.py")
# The builder and the modules it imports: a change to any builds the zoo again.
SOURCES = [
    BUILDER,
    *(
        BUILDER.with_name(f"{m}.py")
        for m in ("classifiers", "detectors", "embedders", "keypointers")
    ),
]
ZOO_PYTHON = ROOT / ".venv-zoo" / "bin" / "python"
CONSTRAINTS = ROOT / "constraints-zoo.txt"
CACHE = ROOT / ".cache" / "zoo"
BUILD_TIMEOUT = 3600  # seconds; about 5 minutes on an idle 2-core machine


def zoo_key() -> str:
    digest = hashlib.sha256()
    for path in (*SOURCES, CONSTRAINTS):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_zoo() -> Path:
    """The zoo's directory, built first when the cache has none for this key."""
    target = CACHE / zoo_key()
    if (target / "expected.json").exists():
        return target
    if not ZOO_PYTHON.exists():
        tools.missing(str(ZOO_PYTHON), "run `make zoo-venv` (make test does)")
    partial = CACHE / f"{target.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    log = partial.with_suffix(".log")
    with log.open("wb") as out:
        result = subprocess.run(
            [str(ZOO_PYTHON), str(BUILDER), str(partial)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        pytest.fail(f"building the zoo failed (exit {result.returncode}); {log}:\n{tail}")
    # Old zoos go: each is a few hundred MB.
    for old in CACHE.iterdir():
        if old.is_dir() and old != partial:
            shutil.rmtree(old, ignore_errors=True)
    partial.rename(target)
    log.unlink(missing_ok=True)
    return target


@pytest.fixture(scope="session")
def zoo() -> Path:
    return build_zoo()


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
