"""Istio in the renders with a mesh: routes that never retry overload, gateway retries that
yield to the mesh's, rules that name Services and ports of the render, timeouts above the
gateway's deadline, sidecars that outlive their containers, STRICT mTLS and who may call TF
Serving.
"""

from __future__ import annotations

import pytest
import yaml

from gateway.config import Settings
from tests.support.renders import (
    GATEWAY,
    MESH_TARGETS,
    READINESS_SERVICE,
    TARGETS,
    TFSERVING,
    container,
    find,
    gateway_settings,
    ident,
    of_kind,
    parse_duration,
    pod_spec,
    prestop_sleep,
    rendered,
    selects,
    split_target,
)

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
