"""One local TF Serving and one gateway with both doors for the HTTP door's tests.

Models: the reference detectors from `model_repo`, `colours` (a small classifier made here:
uint8 pixels in, the share of red-, green- and blue-dominated pixels out as probabilities),
and the reference classifiers when `model_repo` has them. The batch jobs' tests
(test_jobs_http*.py) share one more gateway, with the jobs API.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.jobs import make_images
from tests.support.localserver import LocalServer, run_local_server

ROOT = Path(__file__).resolve().parents[3]
DETECTORS = ("detector", "detector_encoded")
REFERENCE_CLASSIFIERS = ("classifier", "classifier_scores", "classifier_logits")
COLOURS = ("red", "green", "blue")
MAX_IMAGE_BYTES = 4 * 1024 * 1024


def save_colour_classifier(path: Path) -> None:
    import tensorflow as tf

    class Colours(tf.Module):
        @tf.function(
            input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="input_tensor")]
        )
        def __call__(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            dominant = tf.one_hot(tf.argmax(images, axis=-1), 3, dtype=tf.float32)
            return {"probabilities": tf.reduce_mean(dominant, axis=[1, 2])}

    module = Colours()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})


def classifiers(repo: Path) -> list[str]:
    """`colours`, and the reference classifiers once model_repo exports them."""
    return ["colours", *(name for name in REFERENCE_CLASSIFIERS if (repo / name / "1").is_dir())]


def _section(toml: str, name: str) -> list[str]:
    """The lines of [models.<name>] and its sub-tables, with the labels path made absolute."""
    lines, inside = [], False
    for line in toml.splitlines():
        if line.startswith("[models."):
            inside = line in (f"[models.{name}]", f"[models.{name}.input]")
        if inside:
            lines.append(line.replace('"labels.txt"', f'"{ROOT / "serving" / "labels.txt"}"'))
    return lines


@pytest.fixture(scope="session")
def http_repo(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("http-models")
    shutil.copytree(model_repo, root, dirs_exist_ok=True)
    save_colour_classifier(root / "colours" / "1")
    (root / "colours.txt").write_text("\n".join(COLOURS) + "\n")
    names = sorted(p.name for p in root.iterdir() if (p / "1").is_dir())
    # `detector` has a version label, for the /labels/{label} routes.
    labels = {"detector": "version_labels { key: 'stable' value: 1 } "}
    (root / "models.config").write_text(
        "model_config_list {\n"
        + "".join(
            f"  config {{ name: '{n}' base_path: '{root / n}' model_platform: 'tensorflow' "
            f"{labels.get(n, '')}}}\n"
            for n in names
        )
        + "}\n"
    )
    label_map = root / "detector" / "1" / "assets.extra" / "label_map.pbtxt"
    toml = ['default_model = "detector"', "", "[defaults]", 'detection = "detector"']
    toml.append('classification = "colours"')
    for name in DETECTORS:
        toml += ["", f"[models.{name}]", 'task = "detection"', f'label_map = "{label_map}"']
    toml += [
        "",
        "[models.colours]",
        'task = "classification"',
        f'labels = "{root / "colours.txt"}"',
    ]
    # The reference classifiers' settings as `make run` uses them (serving/gateway-models.toml).
    reference = (ROOT / "serving" / "gateway-models.toml").read_text()
    for name in classifiers(root)[1:]:
        toml += ["", *_section(reference, name)]
    (root / "gateway-models.toml").write_text("\n".join(toml) + "\n")
    return root


@pytest.fixture(scope="session")
def http_tfs(http_repo: Path) -> Iterator[LocalServer]:
    args = [
        f"--model_config_file={http_repo / 'models.config'}",
        # Labels are assigned while the config loads, before version 1 is AVAILABLE.
        "--allow_version_labels_for_unavailable_models",
    ]
    with run_local_server(args) as server:
        yield server


@pytest.fixture(scope="session")
def http_gateway(
    http_tfs: LocalServer, http_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    args = [
        f"--model-config={http_repo / 'gateway-models.toml'}",
        f"--max-image-bytes={MAX_IMAGE_BYTES}",
    ]
    with run_gateway(
        http_tfs.target, args, log_dir=tmp_path_factory.mktemp("http-logs"), http=True
    ) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def gateway(http_gateway: GatewayProcess) -> GatewayProcess:
    """The shared gateway, under the name the end-to-end tests of the door use."""
    return http_gateway


@pytest.fixture(scope="module")
def channel(gateway: GatewayProcess) -> Iterator[grpc.Channel]:
    """A gRPC channel to the same gateway, for comparing the doors."""
    with gateway.channel() as channel:
        yield channel


@pytest.fixture(scope="package")
def jobs_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`allowed/`: 3 images under the prefix the jobs gateway lets jobs read."""
    root = tmp_path_factory.mktemp("http-jobs-data")
    make_images(root / "allowed", 3)
    return root


@pytest.fixture(scope="package")
def jobs_gateway(
    http_tfs: LocalServer,
    http_repo: Path,
    jobs_dataset: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """A gateway with the jobs API and both doors (anonymous callers allowed), started once for
    the jobs' tests of the door (test_jobs_http.py and test_jobs_http_page.py)."""
    args = [
        f"--model-config={http_repo / 'gateway-models.toml'}",
        f"--job-store={tmp_path_factory.mktemp('http-jobs-store')}",
        f"--batch-allowed-input-uris={jobs_dataset / 'allowed'}",
        "--batch-checkpoint-seconds=0.2",
        "--batch-allow-anonymous=true",
    ]
    with run_gateway(
        http_tfs.target, args, log_dir=tmp_path_factory.mktemp("http-jobs-logs"), http=True
    ) as gateway:
        yield gateway


# Headless chromium for the page's tests (tests/support/browser.py).
from tests.support.browser import browser  # noqa: E402, F401
