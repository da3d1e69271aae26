"""Every render against a real API server (envtest): `kubectl apply --dry-run=server
--validate=strict` after Istio's CRDs, so admission, defaulting, CEL rules of the CRDs and
Pod Security all have their say; plus the pinned CRD file itself."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.k8s.conftest import ISTIO_CRDS, ISTIO_VERSION, ROOT
from tests.support.apiserver import KUBECTL, ApiServer

K8S = ROOT / "k8s"
ISTIO_CRDS_SHA256 = "dcb43ff6b9af2f629b80b6a82597f5a91db259c757e66cc5353ac007da28351a"
# Every kustomization that is deployed: the base, each overlay and each job.
TARGETS: dict[str, Path] = {
    "base": K8S / "base",
    **{
        f"{group}/{p.name}": p
        for group in ("overlays", "jobs")
        for p in sorted((K8S / group).iterdir())
        if (p / "kustomization.yaml").is_file()
    },
}
# Namespace labels for renders that bring no Namespace of their own: Pod Security's
# `restricted` profile in warn mode, so a pod template that breaks it shows up as a warning.
RESTRICTED = {
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/warn-version": "latest",
}


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


def render(target: str) -> list[dict]:
    """The objects `kubectl kustomize` renders for a target (a fresh copy each call)."""
    return copy.deepcopy(list(_render(target)))


@functools.cache
def _render(target: str) -> tuple[dict, ...]:
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(TARGETS[target])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def namespace_for(cluster: ApiServer, target: str, objs: list[dict]) -> str:
    """The namespace the render's objects go to, created for real (dry runs need it)."""
    own = [o for o in objs if o["kind"] == "Namespace"]
    if own:
        # Applied for real, with the render's own labels (Pod Security, injection).
        cluster.kubectl("apply", "--filename=-", input=json.dumps(own[0]))
        return str(own[0]["metadata"]["name"])
    name = "render-" + target.replace("/", "-")
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": RESTRICTED},
    }
    cluster.kubectl("apply", "--filename=-", input=json.dumps(namespace))
    return name


def dry_run(
    cluster: ApiServer, namespace: str, objs: list[dict], check: bool = True
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        f"--namespace={namespace}",
        "--filename=-",
        input=yaml.safe_dump_all(objs),
        check=check,
    )


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
