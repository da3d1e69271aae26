"""Fixtures of the local server's lifecycle tests (test_local_versions.py, test_local_config.py):
a repository with two versions of `detector`, exported once for both files, and clients of the
servers each test starts."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from serving.export import export_models
from tests.support.localserver import LocalServer
from tests.support.servingcalls import Client


@pytest.fixture(scope="package")
def two_versions(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with `detector` versions 1 and 2 (read-only: tests copy it)."""
    root = tmp_path_factory.mktemp("two-versions")
    shutil.copytree(model_repo / "detector", root / "detector")
    export_models(root, version=2, names=("detector",))
    return root


@pytest.fixture
def client_of() -> Iterator[Callable[[LocalServer], Client]]:
    channels: list[grpc.Channel] = []

    def connect(server: LocalServer) -> Client:
        channels.append(server.channel())
        return Client(channels[-1])

    yield connect
    for channel in channels:
        channel.close()
