"""Batch on Kubernetes: the Indexed Job of k8s/jobs/batch and the RBAC of the gateway's batch
executor (components/jobs: a Role bound to the gateway's own ServiceAccount), from the renders
and against a real API server (envtest), where that ServiceAccount is impersonated."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gateway.jobs.runner import __main__ as runner
from tests.support.apiserver import ApiServer
from tests.support.dryrun import namespace_for, render

Obj = dict[str, Any]

ROLE = "detection-batch-executor"
RUNNER = "detection-batch"
GATEWAY = "detection-gateway"
# The kubernetes executor is the gateway process: it acts as the gateway's ServiceAccount.
EXECUTOR = GATEWAY
# What the executor may do, all in its own namespace; everything else is refused.
ALLOWED = {
    ("batch", "jobs"): {"create", "get", "list", "watch", "delete"},
    ("", "pods"): {"get", "list"},
}


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def job_objects() -> tuple[Obj, Obj]:
    objs = render("jobs/batch")
    return find(objs, "Job"), find(objs, "ConfigMap")


def flag(args: list[str], name: str) -> str:
    values = [a.partition("=")[2] for a in args if a.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} given {len(values)} times in {args}"
    return values[0]


# ---- the Job, rendered --------------------------------------------------------------------


def test_job_is_indexed_with_one_shard_per_completion() -> None:
    job, _ = job_objects()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    (c,) = spec["template"]["spec"]["containers"]
    # The runner splits the dataset into --shard-count parts and takes JOB_COMPLETION_INDEX's.
    assert int(flag(c["args"], "shard-count")) == spec["completions"]
    assert "--shard-index" not in " ".join(c["args"])
    assert 1 <= spec["parallelism"] <= spec["completions"]
    # Retries per shard, and the Job stops when failures are systematic.
    assert spec["backoffLimitPerIndex"] >= 1
    assert 1 <= spec["maxFailedIndexes"] < spec["completions"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    names = {c["name"] for c in spec["template"]["spec"]["containers"]}
    for rule in spec["podFailurePolicy"]["rules"]:
        if "onExitCodes" in rule:
            assert rule["onExitCodes"]["containerName"] in names
            # Exit 2 (the runner refused the run as asked) fails the shard at once; exit 1
            # (gateway unreachable) and anything else a retry could fix is not listed.
            assert rule["action"] == "FailIndex" and rule["onExitCodes"]["values"] == [2]
        else:
            assert rule == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}


def test_job_runs_the_gateway_image_against_the_gateways_grpc_service() -> None:
    job, configmap = job_objects()
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    gateway = find(render("overlays/prod"), "Deployment", GATEWAY)
    gateway_image = gateway["spec"]["template"]["spec"]["containers"][0]["image"]
    assert c["image"] == gateway_image  # the same release of the same image
    assert c["command"] == ["detection-batch"]
    # Positional INPUT OUTPUT first, from the ConfigMap; every $(VAR) is defined there.
    assert c["args"][:2] == ["$(BATCH_INPUT)", "$(BATCH_OUTPUT)"]
    for ref in re.findall(r"\$\((\w+)\)", " ".join(c["args"])):
        assert ref in configmap["data"], ref
    assert flag(c["args"], "task") == "$(BATCH_TASK)"
    assert configmap["data"]["BATCH_TASK"] in {"detect", "classify"}
    for key in ("BATCH_INPUT", "BATCH_OUTPUT"):
        assert re.match(r"(s3|gs)://|/", configmap["data"][key]), key
    # The target is the gateway Service's gRPC port, as every overlay renders it.
    for overlay in ("overlays/dev", "overlays/prod"):
        service = find(render(overlay), "Service", GATEWAY)
        grpc = {p["name"]: p["port"] for p in service["spec"]["ports"]}["grpc"]
        assert flag(c["args"], "target") == f"{GATEWAY}:{grpc}", overlay
    concurrency = int(flag(c["args"], "concurrency"))
    assert 1 <= concurrency <= 64


def test_job_takes_credentials_from_an_optional_secret_by_reference_only() -> None:
    job, _ = job_objects()
    (c,) = job["spec"]["template"]["spec"]["containers"]
    secrets = [s["secretRef"] for s in c["envFrom"] if "secretRef" in s]
    assert secrets == [{"name": "detection-batch-credentials", "optional": True}]
    # No credential literally in the manifests.
    values = " ".join(str(e.get("value", "")) for e in c.get("env", []))
    values += " " + json.dumps(job_objects()[1]["data"])
    assert not re.search(r"AKIA|SECRET|PRIVATE KEY|password", values, re.IGNORECASE)


def test_job_pods_are_hardened_like_the_gateway() -> None:
    job, _ = job_objects()
    pod = job["spec"]["template"]["spec"]
    gateway = find(render("base"), "Deployment", GATEWAY)["spec"]["template"]["spec"]
    assert pod["securityContext"] == gateway["securityContext"]
    (c,) = pod["containers"]
    assert c["securityContext"] == gateway["containers"][0]["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    account = find(render("jobs/batch"), "ServiceAccount", pod["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    for resource in ("cpu", "memory"):
        assert c["resources"]["requests"][resource] and c["resources"]["limits"][resource]
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/tmp"}
    # Under Istio a classic sidecar would keep the pod running after the runner exits.
    assert (
        job["spec"]["template"]["metadata"]["annotations"]["sidecar.istio.io/nativeSidecar"]
        == "true"
    )


def test_executor_role_lists_exactly_the_allowed_verbs() -> None:
    objs = render("overlays/prod")
    role = find(objs, "Role", ROLE)
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == ALLOWED
    assert not [o for o in objs if o["kind"] in {"ClusterRole", "ClusterRoleBinding"}]
    binding = find(objs, "RoleBinding", ROLE)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": ROLE,
    }
    account = find(objs, "ServiceAccount", EXECUTOR)
    namespace = account["metadata"]["namespace"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": EXECUTOR, "namespace": namespace}
    ]
    # The account mounts no token by default; only the gateway's pod asks for one.
    assert account["automountServiceAccountToken"] is False
    pods = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] == "Deployment"
        and o["spec"]["template"]["spec"].get("automountServiceAccountToken")
    ]
    assert pods == [GATEWAY]


@pytest.mark.parametrize("overlay", ["overlays/dev", "overlays/dev-tls"])
def test_without_the_kubernetes_executor_nothing_may_use_the_api(overlay: str) -> None:
    objs = render(overlay)
    assert not [o for o in objs if o["kind"] in {"Role", "RoleBinding"}]
    assert not [
        o
        for o in objs
        if o["kind"] == "Deployment"
        and o["spec"]["template"]["spec"].get("automountServiceAccountToken", True)
    ]


# ---- against the API server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def executor(cluster: ApiServer) -> tuple[ApiServer, str]:
    """The prod overlay's executor RBAC applied for real; (server, its namespace)."""
    objs = render("overlays/prod")
    namespace = namespace_for(cluster, "overlays/prod", objs)
    rbac = [
        o
        for o in objs
        if (o["kind"], o["metadata"]["name"])
        in {("ServiceAccount", EXECUTOR), ("Role", ROLE), ("RoleBinding", ROLE)}
    ]
    assert len(rbac) == 3
    cluster.kubectl(
        "apply", f"--namespace={namespace}", "--filename=-", input=yaml.safe_dump_all(rbac)
    )
    cluster.kubectl("create", "namespace", "elsewhere", check=False)
    return cluster, namespace


def can_i(server: ApiServer, namespace: str, verb: str, resource: str) -> bool:
    result = server.kubectl(
        "auth", "can-i", verb, resource, f"--namespace={namespace}",
        f"--as=system:serviceaccount:{namespace}:{EXECUTOR}",
        check=False,
    )  # fmt: skip
    assert result.stdout.strip() in {"yes", "no"}, result.stdout + result.stderr
    return result.stdout.strip() == "yes"


def test_executor_may_run_jobs_and_read_pods_in_its_namespace(
    executor: tuple[ApiServer, str],
) -> None:
    server, namespace = executor
    for (group, resource), verbs in ALLOWED.items():
        name = f"{resource}.{group}" if group else resource
        for verb in verbs:
            assert can_i(server, namespace, verb, name), (verb, name)


@pytest.mark.parametrize(
    ("verb", "resource", "where"),
    # `kubectl auth can-i VERB TYPE/NAME` reads a slash as a name, so subresources are
    # given as `TYPE:SUBRESOURCE` here and passed with --subresource.
    [
        ("update", "jobs.batch", "own"),
        ("patch", "jobs.batch", "own"),
        ("deletecollection", "jobs.batch", "own"),
        ("update", "jobs.batch:status", "own"),
        ("create", "cronjobs.batch", "own"),
        ("create", "pods", "own"),
        ("delete", "pods", "own"),
        ("watch", "pods", "own"),
        ("get", "pods:log", "own"),
        ("create", "pods:exec", "own"),
        ("get", "secrets", "own"),
        ("list", "secrets", "own"),
        ("get", "configmaps", "own"),
        ("create", "configmaps", "own"),
        ("get", "deployments.apps", "own"),
        ("patch", "deployments.apps", "own"),
        ("create", "roles.rbac.authorization.k8s.io", "own"),
        ("create", "rolebindings.rbac.authorization.k8s.io", "own"),
        ("create", "serviceaccounts:token", "own"),
        ("create", "jobs.batch", "elsewhere"),
        ("list", "jobs.batch", "elsewhere"),
        ("get", "pods", "elsewhere"),
        ("list", "namespaces", "own"),
    ],
)
def test_executor_may_do_nothing_else(
    executor: tuple[ApiServer, str], verb: str, resource: str, where: str
) -> None:
    server, namespace = executor
    resource, _, subresource = resource.partition(":")
    result = server.kubectl(
        "auth", "can-i", verb, resource, f"--subresource={subresource}",
        f"--namespace={namespace if where == 'own' else where}",
        f"--as=system:serviceaccount:{namespace}:{EXECUTOR}",
        check=False,
    )  # fmt: skip
    assert result.stdout.strip() == "no", (verb, resource, where, result.stdout)


def test_executor_rules_are_only_the_role_and_the_defaults_of_every_account(
    executor: tuple[ApiServer, str],
) -> None:
    server, namespace = executor
    listing = server.kubectl(
        "auth", "can-i", "--list", f"--namespace={namespace}",
        f"--as=system:serviceaccount:{namespace}:{EXECUTOR}",
    ).stdout  # fmt: skip
    granted: dict[str, set[str]] = {}
    for line in listing.splitlines()[1:]:
        # `resource  [non-resource URLs]  [resource names]  [verbs]`; rows for non-resource
        # URLs (/healthz, /version, ...) start with blanks: every account may read those.
        row = re.fullmatch(r"(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*", line)
        if row:
            assert row.group(3) == "", line  # no rule limited to named objects
            granted.setdefault(row.group(1), set()).update(row.group(4).split())
    # What system:basic-user and system:discovery give every authenticated account.
    defaults = {
        "selfsubjectreviews.authentication.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
    }
    expected = {"jobs.batch": ALLOWED[("batch", "jobs")], "pods": ALLOWED[("", "pods")]}
    assert {k: v for k, v in granted.items() if k not in defaults} == expected, listing
    assert all(granted[k] == {"create"} for k in defaults & granted.keys()), listing


def test_executor_creates_watches_and_deletes_a_job_from_the_template(
    executor: tuple[ApiServer, str],
) -> None:
    server, namespace = executor
    job, configmap = job_objects()
    runner = find(render("jobs/batch"), "ServiceAccount", RUNNER)
    # What the Job refers to exists (put there by whoever deploys the runner).
    server.kubectl(
        "apply", f"--namespace={namespace}", "--filename=-",
        input=yaml.safe_dump_all([configmap, runner]),
    )  # fmt: skip
    as_executor = f"--as=system:serviceaccount:{namespace}:{EXECUTOR}"
    created = server.kubectl(
        "create", f"--namespace={namespace}", as_executor, "--output=json", "--filename=-",
        input=json.dumps(job),
    )  # fmt: skip
    stored = json.loads(created.stdout)
    # Stored as written, with the API server's defaults filled in.
    assert stored["spec"]["completions"] == job["spec"]["completions"]
    assert stored["spec"]["completionMode"] == "Indexed"
    assert (
        stored["spec"]["template"]["spec"]["containers"][0]["args"]
        == (job["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    name = stored["metadata"]["name"]
    listed = server.kubectl("get", "jobs", f"--namespace={namespace}", as_executor, "-o", "name")
    assert f"job.batch/{name}" in listed.stdout.split()
    pods = server.kubectl(
        "get", "pods", f"--namespace={namespace}", as_executor,
        f"--selector=batch.kubernetes.io/job-name={name}", "-o", "name",
    )  # fmt: skip
    assert pods.stdout.strip() == ""  # no controller-manager here: no pod is ever made
    # The same Job in another namespace is refused.
    refused = server.kubectl(
        "create", "--namespace=elsewhere", as_executor, "--filename=-",
        input=json.dumps(job), check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    # Changing it is refused too; deleting it is allowed.
    patched = server.kubectl(
        "patch", "job", name, f"--namespace={namespace}", as_executor,
        "--type=merge", "--patch={\"spec\": {\"parallelism\": 1}}", check=False,
    )  # fmt: skip
    assert patched.returncode != 0 and "forbidden" in patched.stderr.lower()
    server.kubectl("delete", "job", name, f"--namespace={namespace}", as_executor, "--wait=false")
    gone = server.kubectl("get", "job", name, f"--namespace={namespace}", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_job_arguments_are_accepted_by_the_batch_runner() -> None:
    job, configmap = job_objects()
    (c,) = job["spec"]["template"]["spec"]["containers"]
    # Kubernetes expands $(VAR) from the container's environment (the ConfigMap) before exec.
    argv = [re.sub(r"\$\((\w+)\)", lambda m: configmap["data"][m.group(1)], a) for a in c["args"]]
    args = runner.run_parser().parse_args(argv)
    assert (args.input, args.output) == (
        configmap["data"]["BATCH_INPUT"],
        configmap["data"]["BATCH_OUTPUT"],
    )
    assert args.shard_count == job["spec"]["completions"]
    assert args.shard_index is None  # taken from JOB_COMPLETION_INDEX in each pod
    assert runner.SHARD_INDEX_ENV == "JOB_COMPLETION_INDEX"
