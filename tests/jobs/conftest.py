"""The run's shared local TF Serving (a detector and a classifier among its models) for the
batch-job tests; each test starts the gateway processes it needs (they differ in settings, and
some are killed)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import jobs as helpers
from tests.support.faultupstream import FaultyUpstream
from tests.support.localserver import LocalServer


@pytest.fixture(scope="session")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving (tests/conftest.py), `detector` and `classifier_scores`
    among its models: the jobs' gateways only send it Predicts (the faults are the
    FaultyUpstream's in front of it)."""
    return reference_serving


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
