"""One local TF Serving and one real gateway process for the batch tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

MAX_PIXELS = 4_000_000


@pytest.fixture(scope="session")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving (tests/conftest.py), `detector` among its models: the
    runners only send it Predicts."""
    return reference_serving


def gateway_args(model_repo: Path) -> list[str]:
    """The batch tests' gateway settings (a gateway of a test's own answers alike)."""
    label_map = model_repo / "detector" / "1" / "assets.extra" / "label_map.pbtxt"
    return [f"--label-maps=detector={label_map}", f"--max-pixels={MAX_PIXELS}"]


@pytest.fixture(scope="session")
def gateway(
    tfs: LocalServer, model_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    args = gateway_args(model_repo)
    with run_gateway(tfs.target, args, log_dir=tmp_path_factory.mktemp("gateway-logs")) as gw:
        yield gw
