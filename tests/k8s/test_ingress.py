"""Callers outside the mesh: the ingress gateway terminates TLS from a Secret reference and
speaks HTTP/2, routes every RPC and the HTTP door to the gateway (and nothing else), its
identity is admitted to exactly what it routes, and it sets no body limit below the gateway's.
"""

from __future__ import annotations

import re

from tests.support.renders import (
    GATEWAY,
    Obj,
    find,
    gateway_settings,
    http_port,
    of_kind,
    parse_duration,
    rendered,
    selects,
)

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
    "/vision.v1.BatchService/CreateBatchJob",
    "/detection.v1.BatchService/CreateBatchJob",  # the earlier name, still served
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
