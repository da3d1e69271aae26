"""Every render against a real API server (envtest): `kubectl apply --dry-run=server
--validate=strict` after Istio's CRDs, so admission, defaulting, CEL rules of the CRDs and
Pod Security all have their say; plus the pinned CRD file itself."""

from __future__ import annotations

import hashlib

import pytest
import yaml

from tests.k8s.conftest import ISTIO_CRDS, ISTIO_VERSION, ROOT
from tests.support.apiserver import ApiServer
from tests.support.dryrun import TARGETS, dry_run, namespace_for, render

K8S = ROOT / "k8s"
ISTIO_CRDS_SHA256 = "dcb43ff6b9af2f629b80b6a82597f5a91db259c757e66cc5353ac007da28351a"


def test_istio_crds_are_the_pinned_release_file() -> None:
    assert hashlib.sha256(ISTIO_CRDS.read_bytes()).hexdigest() == ISTIO_CRDS_SHA256
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster on 870 KB
    crds = [d for d in yaml.load_all(ISTIO_CRDS.read_text(), Loader=loader) if d]
    assert len(crds) == 15
    assert all(c["kind"] == "CustomResourceDefinition" for c in crds)
    # The version the Istio component says it is written for.
    readme = (K8S / "components" / "istio" / "README.md").read_text()
    minor = ".".join(ISTIO_VERSION.split(".")[:2])
    assert f"Istio {minor}" in readme


@pytest.mark.parametrize("target", TARGETS)
def test_every_render_passes_a_server_side_dry_run(cluster: ApiServer, target: str) -> None:
    objs = render(target)
    namespace = namespace_for(cluster, target, objs)
    result = dry_run(cluster, namespace, objs)
    applied = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(objs), result.stdout
    # No warnings: Pod Security `restricted` holds, no deprecated API or unknown field.
    assert result.stderr.strip() == "", result.stderr


def test_server_side_dry_run_refuses_unknown_fields_and_bad_values(cluster: ApiServer) -> None:
    objs = render("overlays/prod")
    namespace = namespace_for(cluster, "overlays/prod", objs)
    for obj in objs:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "detection-gateway":
            probe = obj["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
            probe["grpc"]["servce"] = "x"
        if obj["kind"] == "VirtualService" and obj["metadata"]["name"] == "detection-gateway":
            obj["spec"]["http"][0]["retries"]["retry_on"] = "reset"
        if obj["kind"] == "AuthorizationPolicy" and obj["metadata"]["name"] == "tfserving":
            obj["spec"]["action"] = "PERMIT"
    result = dry_run(cluster, namespace, objs, check=False)
    assert result.returncode != 0
    assert 'unknown field "spec.template.spec.containers[0].readinessProbe.grpc.servce"' in (
        result.stderr
    )
    assert 'unknown field "spec.http[0].retries.retry_on"' in result.stderr
    assert "spec.action" in result.stderr and "PERMIT" in result.stderr
