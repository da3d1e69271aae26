"""What each overlay is for (dev: one of each, client-side balancing; prod: meshed,
autoscaled, namespaced), message size limits that agree end to end, TF Serving's flags and
the configuration files it is given (copies of serving/'s originals), and the NetworkPolicies
of the renders without a mesh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.k8sschema import typed
from tests.support.renders import (
    CLUSTER_SCOPED,
    GATEWAY,
    K8S,
    ROOT,
    TARGETS,
    TFSERVING,
    Obj,
    find,
    gateway_settings,
    http_port,
    ident,
    of_kind,
    parse_quantity,
    rendered,
    selects,
    split_target,
)


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
        "pose-labels.txt",
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
        tmp_path / Path(settings.model_config).name,
        settings.model,
        tasks=built_in_tasks().config_readers,
    )
    for model, task in REFERENCE_MODELS.items():
        config = registry.get(model, task)
        # An embedder has no classes to name.
        assert config.task == task and (config.labels.names or task == "embedding"), model


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
    # DNS to the cluster's DNS pods only, not to any resolver (53 to any address).
    (dns,) = [r for r in policy.egress if {p.port for p in r.ports} == {53}]
    (peer,) = dns.to
    assert peer.namespace_selector.match_labels == {"kubernetes.io/metadata.name": "kube-system"}
    assert peer.pod_selector.match_labels == {"k8s-app": "kube-dns"}
