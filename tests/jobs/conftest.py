"""One local TF Serving (a detector and a classifier) for the batch-job tests; each test
starts the gateway processes it needs (they differ in settings, and some are killed)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import jobs as helpers
from tests.support.faultupstream import FaultyUpstream
from tests.support.localserver import LocalServer, run_local_server

MODELS = ("detector", "classifier_scores")


@pytest.fixture(scope="session")
def tfs(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    config = tmp_path_factory.mktemp("jobs-serving") / "models.config"
    entries = "".join(
        f"config {{ name: '{n}' base_path: '{model_repo / n}' model_platform: 'tensorflow' }}\n"
        for n in MODELS
    )
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    with run_local_server([f"--model_config_file={config}"]) as server:
        yield server


@pytest.fixture(scope="package", autouse=True)
def allowed_inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The gateways of these tests let jobs read the session's temporary directory (the
    gateways of other packages' tests, whose stores lie in it, do not)."""
    helpers.ALLOWED_INPUTS[:] = [str(tmp_path_factory.getbasetemp())]
    yield
    helpers.ALLOWED_INPUTS.clear()


# A job store must not overlap the prefixes jobs may read (the gateway refuses to start):
# these stores live outside the session's temporary directory.
@pytest.fixture
def store() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jobs-store-") as directory:
        yield Path(directory) / "store"


@pytest.fixture(scope="module")
def module_store() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jobs-store-") as directory:
        yield Path(directory) / "store"


@pytest.fixture
def upstream(tfs: LocalServer) -> Iterator[FaultyUpstream]:
    """The module's TF Serving behind a FaultyUpstream (held calls released at the end)."""
    with FaultyUpstream(tfs.target) as faulty:
        try:
            yield faulty
        finally:
            faulty.release()


# The real API server (envtest) of the Kubernetes tests, for the kubernetes executor's tests.
from tests.k8s.conftest import apiserver  # noqa: E402, F401
