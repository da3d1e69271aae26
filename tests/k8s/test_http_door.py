"""The gateway's HTTP door in the renders: served next to gRPC while the probes stay on gRPC,
admitted to the same callers by the mesh, routed like a unary call, and the jobs' paths
routed without a timeout or retries.
"""

from __future__ import annotations

import pytest

from tests.support.renders import (
    GATEWAY,
    MESH_TARGETS,
    TARGETS,
    Obj,
    container,
    find,
    gateway_settings,
    http_port,
    ident,
    of_kind,
    parse_duration,
    rendered,
    selects,
)


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


# Batch jobs over the HTTP door (gateway/frontends/http/job_handlers.py): the longest :wait
# it holds.
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
