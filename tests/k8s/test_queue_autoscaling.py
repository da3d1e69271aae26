"""components/queue-autoscaling: TF Serving's HPA on the gateways' queue (an External metric
served by prometheus-adapter), the gateway's on CPU; from the renders, the adapter rule and a
real API server (envtest: strict server-side dry runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from gateway import metrics
from tests.support.apiserver import ApiServer
from tests.support.dryrun import dry_run, namespace_for, render

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "k8s" / "components" / "queue-autoscaling"
Obj = dict[str, Any]


def hpa(objs: list[Obj], name: str) -> Obj:
    (found,) = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"
                and o["metadata"]["name"] == name]  # fmt: skip
    return found


def external_rule() -> Obj:
    rules = yaml.safe_load((COMPONENT / "prometheus-adapter.yaml").read_text())
    (rule,) = rules["rules"]["external"]
    return dict(rule)


def test_tfserving_scales_on_the_gateways_queue_and_cpu_in_prod() -> None:
    objs = render("overlays/prod")
    kinds = {m["type"]: m for m in hpa(objs, "tfserving")["spec"]["metrics"]}
    assert set(kinds) == {"ContainerResource", "External"}
    assert kinds["ContainerResource"]["containerResource"]["container"] == "tfserving"
    external = kinds["External"]["external"]
    # The metric the adapter's rule serves, per TF Serving pod.
    assert external["metric"] == {"name": external_rule()["name"]["as"]}
    assert external["target"]["type"] == "AverageValue"
    target = float(external["target"]["averageValue"])
    # Below what one pod runs at once (batch threads x batch size): scale out before queueing.
    batching = (ROOT / "k8s" / "base" / "config" / "batching.config").read_text()
    threads = int(re.search(r"num_batch_threads \{ value: (\d+) \}", batching).group(1))
    size = int(re.search(r"max_batch_size \{ value: (\d+) \}", batching).group(1))
    assert 0 < target < threads * size


def test_the_gateway_still_scales_on_its_cpu_only() -> None:
    for target in ("base", "overlays/prod"):
        (metric,) = hpa(render(target), "detection-gateway")["spec"]["metrics"]
        assert metric["type"] == "ContainerResource"
        assert metric["containerResource"]["name"] == "cpu"
        assert metric["containerResource"]["container"] == "gateway"


def test_the_adapter_rule_sums_the_gateways_queue_gauge_in_the_hpas_namespace() -> None:
    rule = external_rule()
    # The series the gateway exports (gateway/metrics.py), scoped to the HPA's namespace.
    assert re.fullmatch(rf"{metrics.MODEL_QUEUE_NAME}\{{namespace!=\"\"\}}", rule["seriesQuery"]), (
        rule["seriesQuery"]
    )
    assert rule["resources"] == {"overrides": {"namespace": {"resource": "namespace"}}}
    # Summed over pods and models: one TF Serving Deployment serves them all.
    assert rule["metricsQuery"] == "sum(<<.Series>>{<<.LabelMatchers>>})"
    # Not a Kubernetes object: kustomize must not pick it up.
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert "resources" not in kustomization


def test_the_hpa_passes_a_strict_server_dry_run_and_a_typo_does_not(cluster: ApiServer) -> None:
    objs = render("overlays/prod")
    namespace = namespace_for(cluster, "overlays/prod", objs)
    autoscaler = hpa(objs, "tfserving")
    result = dry_run(cluster, namespace, [autoscaler])
    assert result.stderr.strip() == "", result.stderr
    stored = json.loads(
        cluster.kubectl(
            "apply", "--dry-run=server", f"--namespace={namespace}", "--output=json",
            "--filename=-", input=json.dumps(autoscaler),
        ).stdout
    )  # fmt: skip
    assert stored["spec"]["metrics"] == autoscaler["spec"]["metrics"]
    broken = json.loads(json.dumps(autoscaler))
    external = broken["spec"]["metrics"][1]["external"]
    external["target"]["averageValu"] = external["target"].pop("averageValue")
    refused = dry_run(cluster, namespace, [broken], check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.metrics[1].external.target.averageValu"' in refused.stderr
