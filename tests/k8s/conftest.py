"""Fixtures for the Kubernetes tests: a real API server when KUBEBUILDER_ASSETS names one.

Tests that need the API server take `apiserver` (or `cluster`, which also has Istio's CRDs
installed) and are skipped with the reason when KUBEBUILDER_ASSETS is unset; `.ci/run` sets
it to ../shared/envtest/bin when that directory exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiserver import ApiServer, run_apiserver

ROOT = Path(__file__).resolve().parents[2]
# Istio's CustomResourceDefinitions for the Istio version the manifests are written for
# (manifests/charts/base/files/crd-all.gen.yaml of the release; see k8s/README.md).
ISTIO_VERSION = "1.30.3"
ISTIO_CRDS = ROOT / "k8s" / "validate" / f"istio-crds-{ISTIO_VERSION}.yaml"


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        pytest.skip(
            "KUBEBUILDER_ASSETS is not set: these tests need etcd and kube-apiserver binaries "
            "(envtest); .ci/run points it at ../shared/envtest/bin when that exists"
        )
    with run_apiserver(Path(assets).resolve(), tmp_path_factory.mktemp("apiserver")) as server:
        yield server


@pytest.fixture(scope="session")
def cluster(apiserver: ApiServer) -> ApiServer:
    """The API server with Istio's CRDs installed and serving (Established)."""
    apiserver.kubectl("apply", "--server-side", f"--filename={ISTIO_CRDS}")
    apiserver.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    return apiserver
