"""Renders every kustomize target under k8s/ (tests/support/renders.py) and checks what each
holds: the expected objects, each Kubernetes object through its typed model (a round trip that
also reports unknown fields; the full schema validation, Istio's included, is `make k8s-check`:
k8s/validate/, tested in test_validate.py), the validator itself, and hardened containers with
resources, pinned images and an environment the gateway accepts.

The other subjects have files of their own: test_probes_and_services.py, test_istio.py,
test_overlays.py (each overlay's purpose, message sizes, TF Serving's flags and files, network
policies), test_http_door.py and test_ingress.py.
"""

from __future__ import annotations

import re

import pytest

from gateway.config import Settings
from gateway.flags import env_name, flag_names
from tests.support.k8sschema import is_kubernetes_kind, kubernetes_schema_problems
from tests.support.renders import (
    EXPECTED_KINDS,
    GATEWAY,
    MESH_TARGETS,
    TARGETS,
    TFSERVING,
    UID,
    UPCOMING_SETTINGS,
    container,
    env_of,
    find,
    gateway_settings,
    ident,
    of_kind,
    parse_quantity,
    pod_spec,
    rendered,
)


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
    known = {env_name(name) for name in flag_names()}
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
