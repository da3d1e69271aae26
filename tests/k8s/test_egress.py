"""components/egress in prod: each workload may send only what it needs (NetworkPolicy egress),
read from the render: the gateway to TF Serving's gRPC port (the port its settings call), DNS,
istiod, and HTTPS (the store, the Kubernetes API) anywhere but the link-local metadata
addresses; the runners to the gateway's gRPC port, DNS, istiod and the store; TF Serving to
DNS and istiod only. Validity on the API server is the prod render's strict dry run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.dryrun import render

Obj = dict[str, Any]
DNS = {("UDP", 53), ("TCP", 53)}
ISTIOD = {("TCP", 15012)}
METADATA = "169.254.0.0/16"
# The cluster's DNS pods: kube-dns or CoreDNS in kube-system (kubeadm, GKE, EKS, AKS).
KUBE_DNS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}


def prod() -> list[Obj]:
    return render("overlays/prod")


def egress_of(objs: list[Obj], app: str) -> list[Obj]:
    """The egress rules of the one Egress policy selecting pods labelled app=`app`."""
    (policy,) = [
        o
        for o in objs
        if o["kind"] == "NetworkPolicy" and o["spec"]["podSelector"]["matchLabels"] == {"app": app}
    ]
    assert policy["spec"]["policyTypes"] == ["Egress"]
    return list(policy["spec"]["egress"])


def ports(rule: Obj) -> set[tuple[str, int]]:
    return {(p["protocol"], p["port"]) for p in rule["ports"]}


def destinations(rules: list[Obj]) -> dict[str, set[tuple[str, int]]]:
    """What each rule allows, keyed by a name for its peers: pod:<app>, istiod, anywhere
    (an ipBlock, which must leave out the metadata addresses), dns (the cluster's DNS pods,
    port 53 only)."""
    found: dict[str, set[tuple[str, int]]] = {}
    for rule in rules:
        peers = rule.get("to", [])
        assert peers, rule  # nothing goes to any address on a port, not even DNS
        (peer,) = peers
        if peer == KUBE_DNS:
            assert ports(rule) == DNS, rule
            key = "dns"
        elif "ipBlock" in peer:
            assert peer["ipBlock"]["cidr"] == "0.0.0.0/0"
            assert METADATA in peer["ipBlock"]["except"], peer
            key = "anywhere"
        elif "namespaceSelector" in peer:
            assert peer["namespaceSelector"]["matchLabels"] == {
                "kubernetes.io/metadata.name": "istio-system"
            }
            assert peer["podSelector"]["matchLabels"] == {"app": "istiod"}
            key = "istiod"
        else:
            key = "pod:" + peer["podSelector"]["matchLabels"]["app"]
        found[key] = found.get(key, set()) | ports(rule)
    return found


def test_the_gateway_sends_only_to_tf_serving_dns_istiod_the_store_and_the_api() -> None:
    objs = prod()
    assert destinations(egress_of(objs, "detection-gateway")) == {
        "pod:tfserving": {("TCP", 8500)},
        "dns": DNS,
        "istiod": ISTIOD,
        "anywhere": {("TCP", 443), ("TCP", 6443)},
    }
    # 8500 is the port the gateway calls and TF Serving's container serves.
    (gateway,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] ==
                  "detection-gateway"]  # fmt: skip
    env = {
        e["name"]: e.get("value")
        for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["GATEWAY_UPSTREAM"].endswith(":8500")


def test_the_runners_send_only_to_the_gateway_dns_istiod_and_the_store() -> None:
    assert destinations(egress_of(prod(), "detection-batch")) == {
        "pod:detection-gateway": {("TCP", 50051)},
        "dns": DNS,
        "istiod": ISTIOD,
        "anywhere": {("TCP", 443)},
    }


def test_tf_serving_sends_nothing_but_its_sidecars_dns_and_istiod() -> None:
    assert destinations(egress_of(prod(), "tfserving")) == {"dns": DNS, "istiod": ISTIOD}


@pytest.mark.parametrize("app", ["detection-gateway", "detection-batch", "tfserving"])
def test_every_prod_pod_has_its_egress_policy_and_only_egress(app: str) -> None:
    objs = prod()
    selected = [
        o for o in objs
        if o["kind"] == "NetworkPolicy"
        and o["spec"]["podSelector"]["matchLabels"].items() <= {"app": app}.items()
    ]  # fmt: skip
    assert len(selected) == 1
    # Ingress stays the mesh's (STRICT mTLS + AuthorizationPolicies): not listed here.
    assert "ingress" not in selected[0]["spec"]
