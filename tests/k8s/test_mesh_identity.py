"""The mesh gives the gateway only the identity its sidecar verified: wherever the gateway
trusts x-forwarded-client-cert (GATEWAY_TRUST_XFCC), its pod is injected with a sidecar whose
inbound listener replaces the header (Istio's ProxyConfig proxyHeaders.forwardedClientCert
SANITIZE_SET) instead of Istio's default for sidecars, APPEND_FORWARD, which keeps what the
client sent in front of the verified element."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.support.dryrun import TARGETS, render

Obj = dict[str, Any]
PROXY_CONFIG = "proxy.istio.io/config"
# Envoy's ForwardClientCertDetails values as Istio's ProxyConfig spells them (mesh/v1alpha1
# proxy.proto, ForwardClientCertDetails).
FORWARD_CLIENT_CERT_DETAILS = {
    "SANITIZE",
    "FORWARD_ONLY",
    "APPEND_FORWARD",
    "SANITIZE_SET",
    "ALWAYS_FORWARD_ONLY",
}


def deployments(target: str) -> list[Obj]:
    return [o for o in render(target) if o["kind"] == "Deployment"]


def trusts_xfcc(deployment: Obj) -> bool:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for c in containers for e in c.get("env", [])}
    return env.get("GATEWAY_TRUST_XFCC") == "true"


def proxy_config(deployment: Obj) -> Obj:
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    return dict(yaml.safe_load(annotations.get(PROXY_CONFIG, "{}")) or {})


def test_prod_trusts_the_header_of_the_gateways_sidecar() -> None:
    gateways = [d for d in deployments("overlays/prod") if trusts_xfcc(d)]
    assert [d["metadata"]["name"] for d in gateways] == ["detection-gateway"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_gateway_that_trusts_the_header_gets_only_what_its_sidecar_verified(
    target: str,
) -> None:
    for deployment in deployments(target):
        config = proxy_config(deployment)
        headers = config.get("proxyHeaders", {})
        setting = headers.get("forwardedClientCert")
        assert setting in FORWARD_CLIENT_CERT_DETAILS | {None}, setting
        if not trusts_xfcc(deployment):
            continue
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels.get("sidecar.istio.io/inject") == "true", target
        assert setting == "SANITIZE_SET", (target, config)
        # The verified element carries the caller's URI SAN (its SPIFFE id): not turned off.
        current = headers.get("setCurrentClientCertDetails", {})
        assert current.get("uri", True) is True, current
