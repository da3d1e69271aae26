"""Pod Security `restricted` enforced (components/pod-security-restricted) on a real API server
(envtest): Pods made from the prod render's pod templates, with the containers Istio 1.30's
injection template adds in CNI mode (istio-validation, istio-proxy: uid 1337, no
capabilities), and the runner Job's pod as gateway/jobs/executors/kube.py builds it, are admitted
in a
namespace labelled as the component labels it; the same pods with the default install's
istio-init (root, NET_ADMIN, NET_RAW) are refused, which is why overlays/prod only warns."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.apiserver import KUBECTL, ApiServer
from tests.support.renders import ROOT
from tests.support.runnerpolicy import runner_job

Obj = dict[str, Any]
NAMESPACE = "psa-restricted"
PROXY_IMAGE = "docker.io/istio/proxyv2:1.30.3"
# Istio 1.30.3, manifests/charts/istio-control/istio-discovery/files/injection-template.yaml:
# the init container's securityContext without and with the CNI agent (pilot.cni.enabled),
# and the proxy's (no tproxy interception, no privileged proxy).
ISTIO_INIT = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
    "readOnlyRootFilesystem": False,
    "runAsGroup": 0,
    "runAsNonRoot": False,
    "runAsUser": 0,
}
ISTIO_UNPRIVILEGED = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsGroup": 1337,
    "runAsNonRoot": True,
    "runAsUser": 1337,
}
ISTIO_VOLUMES = [
    {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
    {"name": "istio-data", "emptyDir": {}},
    {"name": "istio-podinfo", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
    {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
        "audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}}]}},
    {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
]  # fmt: skip


def render_with_component(tmp_path: Path) -> list[Obj]:
    """overlays/prod with components/pod-security-restricted, as its README says to add it."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    prod = os.path.relpath(ROOT / "k8s" / "overlays" / "prod", overlay)
    component = os.path.relpath(ROOT / "k8s" / "components" / "pod-security-restricted", overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [prod], "components": [component]})
    )
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(overlay)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def injected(template: Obj, name: str, cni: bool) -> Obj:
    """A Pod from a pod template, with the containers and volumes Istio's injector adds."""
    spec = copy.deepcopy(template["spec"])
    init = {
        "name": "istio-validation" if cni else "istio-init",
        "image": PROXY_IMAGE,
        "args": ["istio-iptables"],
        "securityContext": ISTIO_UNPRIVILEGED if cni else ISTIO_INIT,
    }
    proxy = {
        "name": "istio-proxy",
        "image": PROXY_IMAGE,
        "args": ["proxy", "sidecar"],
        "securityContext": ISTIO_UNPRIVILEGED,
        "volumeMounts": [{"name": v["name"], "mountPath": f"/var/run/istio/{v['name']}"}
                         for v in ISTIO_VOLUMES],
    }  # fmt: skip
    spec["initContainers"] = [init, *spec.get("initContainers", [])]
    spec["containers"] = [*spec["containers"], proxy]
    spec["volumes"] = [*spec.get("volumes", []), *ISTIO_VOLUMES]
    labels = template.get("metadata", {}).get("labels", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def enforced(cluster: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Obj]:
    """The namespace with the component's labels and the render's ServiceAccounts; returns
    the pod templates to try (gateway, TF Serving, the runner Job's)."""
    objs = render_with_component(tmp_path_factory.mktemp("pod-security"))
    (namespace,) = [o for o in objs if o["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "v1.30"
    namespace = copy.deepcopy(namespace)
    namespace["metadata"]["name"] = NAMESPACE
    # Only Pod Security here: the runner policy's own test covers that policy.
    namespace["metadata"]["labels"].pop("detection.gateway/runner-policy", None)
    accounts = [copy.deepcopy(o) for o in objs if o["kind"] == "ServiceAccount"]
    for account in accounts:
        account["metadata"]["namespace"] = NAMESPACE
    cluster.kubectl("apply", "--filename=-", input=yaml.safe_dump_all([namespace, *accounts]))
    templates = {
        o["metadata"]["name"]: o["spec"]["template"] for o in objs if o["kind"] == "Deployment"
    }
    templates["detection-batch"] = runner_job()["spec"]["template"]
    return templates


def create(server: ApiServer, pod: Obj) -> subprocess.CompletedProcess[str]:
    return server.kubectl(
        "create", "--dry-run=server", f"--namespace={NAMESPACE}", "--filename=-",
        input=json.dumps(pod), check=False,
    )  # fmt: skip


@pytest.mark.parametrize("workload", ["detection-gateway", "tfserving", "detection-batch"])
def test_pods_with_istios_cni_mode_sidecar_are_admitted_under_restricted(
    cluster: ApiServer, enforced: dict[str, Obj], workload: str
) -> None:
    result = create(cluster, injected(enforced[workload], f"{workload}-cni", cni=True))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # not even a warning


@pytest.mark.parametrize("workload", ["detection-gateway", "tfserving", "detection-batch"])
def test_pods_with_the_default_istio_init_are_refused_under_restricted(
    cluster: ApiServer, enforced: dict[str, Obj], workload: str
) -> None:
    result = create(cluster, injected(enforced[workload], f"{workload}-init", cni=False))
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted:v1.30"' in result.stderr, result.stderr
    assert "NET_ADMIN" in result.stderr and "istio-init" in result.stderr, result.stderr
