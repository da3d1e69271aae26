"""Fixtures for the security suite: a real local TF Serving with the reference detector, a
small scene image it finds boxes in, and the directories the batch-job tests read from. Each
test module starts the gateways it attacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.support.jobs import make_images
from tests.support.localserver import LocalServer


@pytest.fixture(scope="session")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving (tests/conftest.py), with `detector` (uint8 pixels)
    version 1 among its models: the tests only send it Predicts."""
    return reference_serving


@pytest.fixture(scope="session")
def scene_png() -> bytes:
    scene = scenes.generate_scene(np.random.default_rng(7), 160, 120, 2)
    return scenes.encode(scene.pixels, "PNG")


@pytest.fixture(scope="session")
def request_small(scene_png: bytes) -> pb.DetectRequest:
    return pb.DetectRequest(image=scene_png)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """For the batch jobs' tests (test_jobs_access.py, test_jobs_storage.py): `data` (the
    allowed prefix, with a dataset `set` of 3 images and a symlink `escape` out to `secret`),
    `secret` (2 images outside it) and `root` (both, and `data-sibling`, which shares the
    prefix's leading characters). Per module: cheap to make, and the tests write into it."""
    root = tmp_path_factory.mktemp("jobs-access")
    data, secret = root / "data", root / "secret"
    make_images(data / "set", 3)
    make_images(secret, 2)
    (data / "data-twin").mkdir()
    (root / "data-sibling").mkdir()
    make_images(root / "data-sibling", 1)
    (data / "escape").symlink_to(secret)
    return {"root": root, "data": data, "secret": secret}
