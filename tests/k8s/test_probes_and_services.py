"""Probes, shutdown and Services in every render: gRPC health probes with the gateway's own
service names, shutdown timings that let in-flight requests finish, gRPC ports a mesh
recognises, and references (upstream, selectors, service accounts, scrape annotations,
autoscalers, namespaces) that resolve inside one render.
"""

from __future__ import annotations

import re

import pytest

from tests.support.renders import (
    CLUSTER_SCOPED,
    GATEWAY,
    LIVENESS_SERVICE,
    READINESS_SERVICE,
    TARGETS,
    TFSERVING,
    Obj,
    container,
    find,
    gateway_settings,
    ident,
    of_kind,
    pod_spec,
    prestop_sleep,
    rendered,
    selected_deployments,
    selects,
    split_target,
)


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
            if metric["type"] not in {"ContainerResource", "Resource"}:
                continue  # External: components/queue-autoscaling (test_queue_autoscaling.py)
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
