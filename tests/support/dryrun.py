"""The kustomizations that are deployed (the base, each overlay, each job) and a server-side
dry run of their objects on envtest's API server (tests/support/apiserver.py), in a namespace
made for the render: for the tests of k8s/ on a real API server (tests/k8s, tests/jobs)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import yaml

from tests.support.apiserver import ApiServer
from tests.support.renders import K8S, kustomize

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


def render(target: str) -> list[dict]:
    """The objects `kubectl kustomize` renders for a target (a fresh copy each call)."""
    return copy.deepcopy(list(kustomize(TARGETS[target])))


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
