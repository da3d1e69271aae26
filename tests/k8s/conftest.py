"""Fixtures for the Kubernetes tests: a real API server when KUBEBUILDER_ASSETS names one.

Tests that need the API server take `apiserver` (or `cluster`, which also has Istio's CRDs
installed) and are skipped with the reason when KUBEBUILDER_ASSETS is unset; `.ci/run` sets
it to ../shared/envtest/bin when that directory exists, and under CI=1 the tests fail without it
there (tests/support/tools.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import tools
from tests.support.apiserver import ApiServer, run_apiserver

ROOT = Path(__file__).resolve().parents[2]
# Istio's CustomResourceDefinitions for the Istio version the manifests are written for
# (manifests/charts/base/files/crd-all.gen.yaml of the release; see k8s/README.md).
ISTIO_VERSION = "1.30.3"
ISTIO_CRDS = ROOT / "k8s" / "validate" / f"istio-crds-{ISTIO_VERSION}.yaml"


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    assets = tools.envtest_assets()
    with run_apiserver(assets, tmp_path_factory.mktemp("apiserver")) as server:
        yield server


@pytest.fixture(scope="session")
def cluster(apiserver: ApiServer) -> ApiServer:
    """The API server with Istio's CRDs installed and serving (Established)."""
    apiserver.kubectl("apply", "--server-side", f"--filename={ISTIO_CRDS}")
    apiserver.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    return apiserver
