"""The runner admission policy of k8s/components/jobs (runner-policy.yaml) for tests: the
Job gateway/jobs/executors/kube.py builds with the prod overlay's settings, and the policy with its
binding, parameter and RBAC installed on a real API server (tests/support/apiserver.py).

The gateway's batch settings are read from the policy's ConfigMap, as the rendered
Deployment reads them (configMapKeyRef), so the Job built here is the one a prod gateway
would create.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import yaml

from gateway.config import Settings
from gateway.domain import ModelRef
from gateway.flags import parse_settings
from gateway.jobs.executors import kube
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job
from gateway.tasks.builtin import BUILT_IN
from tests.support.apiserver import ApiServer
from tests.support.dryrun import render
from tests.support.renders import GATEWAY, container, env_of, find

Obj = dict[str, Any]
POLICY = "detection-batch-runner"
# The policy becomes active when the API server's informer has seen it and its binding.
ACTIVE_TIMEOUT = 60.0
JOB_ID = "5f1c0e9a2b7d4c3e8a6f0b1d"  # as gateway.jobs.spec.records.new_id: 24 hex digits
UPLOAD_ID = "0a1b2c3d4e5f60718293a4b5"


def prod_objects() -> list[Obj]:
    return render("overlays/prod")


def gateway_image(objs: list[Obj]) -> str:
    return str(container(find(objs, "Deployment", GATEWAY), "gateway")["image"])


def prod_settings(objs: list[Obj], **changes: str) -> Settings:
    """The prod gateway's settings (its Deployment's environment, ConfigMap values resolved),
    with `changes` to the policy's ConfigMap keys (e.g. allowedInputUris)."""
    objs = copy.deepcopy(objs)
    find(objs, "ConfigMap", POLICY)["data"].update(changes)
    env = env_of(container(find(objs, "Deployment", GATEWAY), "gateway"), objs)
    return parse_settings([], environ=env)


def runner_job(
    options: dict[str, Any] | None = None,
    task: str = "detection",
    namespace: str = "runner-policy",
    output: str = "",
    upload: bool = True,
    settings: Settings | None = None,
    caller: str = "uri:spiffe://cluster.local/ns/a/sa/b",
    model: ModelRef | None = None,
) -> Obj:
    """The Job gateway/jobs/executors/kube.py creates for a batch job under the prod overlay:
    over an upload (or a dataset below the allowed prefix), into the store (or `output`); the
    runner pods' mesh identity set, so their calls name the job's owner (--owner)."""
    objs = prod_objects()
    settings = dataclasses.replace(
        settings or prod_settings(objs),
        batch_runner_identities=f"uri:spiffe://cluster.local/ns/{namespace}/sa/detection-batch",
    )
    store = settings.job_store.rstrip("/")
    spec = JobSpec(
        input=f"{store}/uploads/{UPLOAD_ID}" if upload else "s3://datasets/images/cats/",
        output=output or f"{store}/jobs/{JOB_ID}/output",
        task=task,
        model=model or ModelRef("detector", 3),
        options=options or {},
        format="manifest",
        shards=4,
    )
    job = Job(id=JOB_ID, caller=caller, spec=spec,
              executor="kubernetes", units=[], total=None,
              upload_id=UPLOAD_ID if upload else "")  # fmt: skip
    binding = spec.binding(BUILT_IN)
    return kube.job_manifest(job, settings, namespace, binding, gateway_image(objs))


def moved(obj: Obj, namespace: str) -> Obj:
    """A rendered object in `namespace`."""
    obj = copy.deepcopy(obj)
    if obj["kind"] == "Namespace":
        obj["metadata"]["name"] = namespace
    elif "namespace" in obj["metadata"]:
        obj["metadata"]["namespace"] = namespace
    for subject in obj.get("subjects", []):
        subject["namespace"] = namespace
    return obj


def create(
    server: ApiServer, job: Obj, namespace: str, as_gateway: bool = True, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    """`kubectl create` of `job`, as the gateway's ServiceAccount unless `as_gateway` is off."""
    args = ["create", f"--namespace={namespace}", "--filename=-", "--output=name"]
    if as_gateway:
        args.append(f"--as=system:serviceaccount:{namespace}:{GATEWAY}")
    if dry_run:
        args.append("--dry-run=server")
    return server.kubectl(*args, input=json.dumps(job), check=False)


def install(
    server: ApiServer, namespace: str, objs: list[Obj] | None = None, suffix: str = ""
) -> None:
    """The overlay's Namespace labels, RBAC, policy, binding and parameter applied for real in
    `namespace`; returns once the policy is active. With `suffix`, a copy of the cluster-wide
    policy and binding named with it and bound to `namespace` alone, which a module may leave
    in place: on kube-apiserver 1.36, once a policy is deleted, a binding created later with
    the same parameter kind kept answering "no params found" for longer than the 60 s a test
    waits (seen in tests/k8s when test_jobs_cluster deleted its copy)."""
    objs = objs if objs is not None else prod_objects()
    wanted = {
        ("Namespace", "detection"),
        ("ServiceAccount", GATEWAY),
        ("ServiceAccount", "detection-batch"),
        ("Role", "detection-batch-executor"),
        ("RoleBinding", "detection-batch-executor"),
        ("ValidatingAdmissionPolicy", POLICY),
        ("ValidatingAdmissionPolicyBinding", POLICY),
        ("ConfigMap", POLICY),
    }
    chosen = [moved(o, namespace) for o in objs if (o["kind"], o["metadata"]["name"]) in wanted]
    assert len(chosen) == len(wanted)
    for obj in chosen if suffix else []:  # a copy bound to `namespace` alone
        if obj["kind"].startswith("ValidatingAdmissionPolicy"):
            obj["metadata"]["name"] += suffix
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            obj["spec"]["policyName"] += suffix
            obj["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] = {
                "kubernetes.io/metadata.name": namespace
            }
    server.kubectl("apply", "--filename=-", input=yaml.safe_dump_all(chosen))
    # Active: the runner's Job admitted, another image refused by the policy's own rule (not
    # for a parameter the API server has not seen yet).
    admitted = runner_job(namespace=namespace)
    refused = runner_job(namespace=namespace)
    refused["spec"]["template"]["spec"]["containers"][0]["image"] = "busybox"
    deadline = time.monotonic() + ACTIVE_TIMEOUT
    while True:
        denied = create(server, refused, namespace, dry_run=True).stderr
        passed = create(server, admitted, namespace, dry_run=True)
        if "runs the gateway image" in denied and passed.returncode == 0:
            return
        assert time.monotonic() < deadline, f"the policy never became active: {passed.stderr}"
        time.sleep(0.2)


def uninstall(server: ApiServer, suffix: str = "") -> None:
    """The cluster-wide policy and binding deleted (other tests share the API server)."""
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        server.kubectl("delete", kind, POLICY + suffix, "--wait=false", "--ignore-not-found")


def flag(name: str, value: str) -> Callable[[Obj, Obj], None]:
    """Every `--name=` argument replaced by `--name=value`."""

    def change(c: Obj, p: Obj) -> None:
        c["args"] = [f"--{name}={value}" if a.startswith(f"--{name}=") else a for a in c["args"]]

    return change


def job_spec(**fields: Any) -> Callable[[Obj, Obj], None]:
    """A change of the Job's own spec (not the pod's): applied by `refused_job`."""
    return lambda c, p: p.setdefault("__job__", {}).update(fields)
