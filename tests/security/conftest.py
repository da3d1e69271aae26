"""Fixtures for the security suite: a real local TF Serving with the reference detector, and
a small scene image it finds boxes in. Each test module starts the gateways it attacks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.support.localserver import LocalServer, run_local_server


@pytest.fixture(scope="session")
def tfs(model_repo: Path) -> Iterator[LocalServer]:
    """A real local TF Serving with `detector` (uint8 pixels) version 1."""
    args = ["--model_name=detector", f"--model_base_path={model_repo / 'detector'}"]
    with run_local_server(args) as server:
        yield server


@pytest.fixture(scope="session")
def scene_png() -> bytes:
    scene = scenes.generate_scene(np.random.default_rng(7), 160, 120, 2)
    return scenes.encode(scene.pixels, "PNG")


@pytest.fixture(scope="session")
def request_small(scene_png: bytes) -> pb.DetectRequest:
    return pb.DetectRequest(image=scene_png)
