"""One local TF Serving and one real gateway process for the batch tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, run_local_server

MAX_PIXELS = 4_000_000


@pytest.fixture(scope="session")
def tfs(model_repo: Path) -> Iterator[LocalServer]:
    args = ["--model_name=detector", f"--model_base_path={model_repo / 'detector'}"]
    with run_local_server(args) as server:
        yield server


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
