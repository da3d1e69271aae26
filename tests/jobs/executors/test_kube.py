"""The kubernetes executor against a real API server (envtest: no controller runs, so the
test writes the Job status a controller would, through the status subresource, and runs the
shards' "pods" itself: the batch runner with the Job's own arguments and its
JOB_COMPLETION_INDEX). The gateway authenticates with a token of the executor's
ServiceAccount (the gateway's own), bound by k8s/components/jobs's Role exactly as written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.longrunning import operations_pb2 as lro

from gateway.jobs.runner.__main__ import run_parser
from gateway.proto.detection.v1 import detection_pb2 as pb
from tests.support.apiserver import ApiServer
from tests.support.dryrun import render
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, State, gateway, make_images, metadata, options, result
from tests.support.kubejobs import OPERATION_LABEL, kube_job, now, write_job_status

ROOT = Path(__file__).resolve().parents[3]
NAMESPACE = "batch-jobs"
EXECUTOR = "detection-gateway"


@pytest.fixture(scope="module")
def kubeconfig(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig holding a token of the executor's ServiceAccount, RBAC as shipped."""
    apiserver.kubectl("create", "namespace", NAMESPACE)
    apiserver.kubectl("create", "serviceaccount", EXECUTOR, f"--namespace={NAMESPACE}")
    rbac = ROOT / "k8s" / "components" / "jobs" / "rbac.yaml"
    apiserver.kubectl("apply", f"--namespace={NAMESPACE}", f"--filename={rbac}")
    token = apiserver.kubectl(
        "create", "token", EXECUTOR, f"--namespace={NAMESPACE}", "--duration=2h"
    ).stdout.strip()
    path = tmp_path_factory.mktemp("kube") / "executor.kubeconfig"
    cluster = {"server": apiserver.url, "insecure-skip-tls-verify": True}
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "t",
                        "cluster": cluster,
                    }
                ],
                "users": [{"name": "executor", "user": {"token": token}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "executor"}}],
                "current-context": "t",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def setup(tfs, kubeconfig, tmp_path_factory, module_store) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("kube-jobs")
    make_images(root / "images", 6)
    extra = [
        "--batch-executor=kubernetes",
        f"--batch-kubeconfig={kubeconfig}",
        f"--batch-namespace={NAMESPACE}",
        "--batch-image=registry.example/detection-gateway:test",
        "--batch-parallelism=2",
    ]
    return {"root": root, "images": root / "images", "store": module_store, "extra": extra}


@pytest.fixture(scope="module")
def gw(tfs, setup) -> Iterator[GatewayProcess]:
    with gateway(tfs, setup["store"], setup["root"], setup["extra"]) as process:
        yield process


@pytest.fixture(scope="module")
def client(gw: GatewayProcess) -> Iterator[Client]:
    with gw.channel() as channel:
        yield Client(channel)


def run_pod(job: dict[str, Any], index: int, target: str) -> None:
    """One shard's pod: the container's command and arguments, with JOB_COMPLETION_INDEX,
    calling the gateway on loopback instead of its Service."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = [f"--target={target}" if a.startswith("--target=") else a for a in container["args"]]
    env = {"JOB_COMPLETION_INDEX": str(index), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.jobs.runner", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_job_it_creates_is_the_template_with_the_jobs_values(apiserver, client, setup) -> None:
    op = client.create(
        input_uri=str(setup["images"]),
        shards=3,
        options=options(pb.DetectRequest(min_score=0.25)),
    )
    assert metadata(op).state == State.QUEUED
    stored = kube_job(apiserver, NAMESPACE, op.name)  # accepted by the API server as it was sent
    (template,) = [o for o in render("jobs/batch") if o["kind"] == "Job"]
    # The template as the API server stores it (defaults filled in), for a like comparison.
    template = json.loads(
        apiserver.kubectl(
            "create", f"--namespace={NAMESPACE}", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(template),
        ).stdout
    )  # fmt: skip
    spec, want = stored["spec"], template["spec"]
    for key in ("completionMode", "backoffLimitPerIndex", "podFailurePolicy"):
        assert spec[key] == want[key], key
    assert spec["ttlSecondsAfterFinished"] == want["ttlSecondsAfterFinished"]
    assert (spec["completions"], spec["parallelism"], spec["maxFailedIndexes"]) == (3, 2, 3)
    pod, want_pod = spec["template"]["spec"], want["template"]["spec"]
    for key in (
        "restartPolicy", "serviceAccountName", "automountServiceAccountToken",
        "terminationGracePeriodSeconds", "securityContext", "volumes",
    ):  # fmt: skip
        assert pod[key] == want_pod[key], key
    assert (
        spec["template"]["metadata"]["annotations"] == want["template"]["metadata"]["annotations"]
    )
    (c,), (w,) = pod["containers"], want_pod["containers"]
    for key in ("name", "command", "securityContext", "volumeMounts", "resources"):
        assert c[key] == w[key], key
    assert [e for e in c["envFrom"] if "secretRef" in e] == [
        e for e in w["envFrom"] if "secretRef" in e
    ]
    assert c["image"] == "registry.example/detection-gateway:test"
    args = run_parser().parse_args(c["args"])
    assert (args.input, args.shard_count) == (str(setup["images"]), 3)
    # The options in the one generic shape (the admission policy names no task's option).
    assert args.generic_options == ["min_score=0.25"]
    assert args.output == metadata(op).output_uri
    assert stored["metadata"]["labels"][OPERATION_LABEL] == op.name.removeprefix("operations/")


def test_state_follows_the_job_status_and_the_shard_markers(apiserver, gw, client, setup) -> None:
    op = client.create(input_uri=str(setup["images"]), shards=3)
    job = kube_job(apiserver, NAMESPACE, op.name)
    name = job["metadata"]["name"]
    assert metadata(client.get(op.name)).state == State.QUEUED
    write_job_status(apiserver, NAMESPACE, name, {"startTime": now(), "active": 2})
    assert metadata(client.get(op.name)).state == State.RUNNING

    run_pod(job, 1, gw.target)
    meta = metadata(client.get(op.name))
    assert meta.state == State.RUNNING
    assert [(s.index, s.processed, s.done) for s in meta.shards] == [
        (0, 0, False), (1, 2, True), (2, 0, False),
    ]  # fmt: skip
    run_pod(job, 0, gw.target)
    run_pod(job, 2, gw.target)
    done = client.get(op.name)
    assert done.done and metadata(done).state == State.SUCCEEDED, done
    assert dict(result(done).code_counts) == {"OK": 6}
    assert [x.id for x in client.lines(op.name)] == [f"img-{i:05d}.jpg" for i in range(6)]

    # Another replica (same job store, same API) sees the same jobs.
    with (
        gateway(gw_tfs(gw), setup["store"], setup["root"], setup["extra"]) as other,
        other.channel() as channel,
    ):
        again = Client(channel).get(op.name)
    assert again == done

    client.ops.DeleteOperation(lro.DeleteOperationRequest(name=op.name))
    gone = apiserver.kubectl("get", "job", name, f"--namespace={NAMESPACE}", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def gw_tfs(gw: GatewayProcess) -> Any:
    """The TF Serving the gateway calls (its --upstream), for a second replica."""
    (upstream,) = [a for a in gw.process.args if str(a).startswith("--upstream=")]  # type: ignore[union-attr]

    class Upstream:
        target = str(upstream).split("=", 1)[1]

    return Upstream()


def test_a_failed_job_status_fails_the_operation(apiserver, client, setup) -> None:
    op = client.create(input_uri=str(setup["images"]), shards=2)
    name = kube_job(apiserver, NAMESPACE, op.name)["metadata"]["name"]
    started = now()
    write_job_status(apiserver, NAMESPACE, name, {"startTime": started, "active": 1})
    assert metadata(client.get(op.name)).state == State.RUNNING
    condition = {"status": "True", "reason": "FailedIndexes", "message": "Job has failed indexes"}
    write_job_status(
        apiserver,
        NAMESPACE,
        name,
        {
            "active": 0,
            "failed": 4,
            "failedIndexes": "1",
            "conditions": [
                {"type": "FailureTarget", **condition, "lastTransitionTime": started},
                {"type": "Failed", **condition, "lastTransitionTime": started},
            ],
        },
    )
    done = client.get(op.name)
    assert done.done and metadata(done).state == State.FAILED
    assert done.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "FailedIndexes" in done.error.message and "failed shards: 1" in done.error.message


def test_cancel_deletes_the_job(apiserver, client, setup) -> None:
    op = client.create(input_uri=str(setup["images"]))
    name = kube_job(apiserver, NAMESPACE, op.name)["metadata"]["name"]
    client.ops.CancelOperation(lro.CancelOperationRequest(name=op.name))
    done = client.get(op.name)
    assert done.done and metadata(done).state == State.CANCELLED
    assert done.error.code == grpc.StatusCode.CANCELLED.value[0]
    gone = apiserver.kubectl("get", "job", name, f"--namespace={NAMESPACE}", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_an_empty_image_is_the_image_of_the_gateways_own_pod(
    apiserver, tfs, setup, tmp_path, monkeypatch, store
) -> None:
    """GATEWAY_BATCH_IMAGE empty: runner pods run the image of the gateway pod's `gateway`
    container, read with the executor's token (the pod named by the downward API's
    POD_NAME/POD_NAMESPACE). A pod it cannot read refuses the job saying what to set; the
    next creation reads it again."""
    pod_name = "detection-gateway-5f7c9d-q2kx8"
    image = "registry.example/detection-gateway@sha256:" + "ab" * 32
    monkeypatch.setenv("POD_NAME", pod_name)
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    extra = [a for a in setup["extra"] if not a.startswith("--batch-image=")]
    with gateway(tfs, store, tmp_path, [*extra, "--batch-image="]) as gw:
        with gw.channel() as channel:
            client = Client(channel)
            with pytest.raises(grpc.RpcError) as info:
                client.create(input_uri=str(setup["images"]))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            details = info.value.details() or ""
            assert f"Pod {NAMESPACE}/{pod_name}" in details and "404" in details, details
            assert "GATEWAY_BATCH_IMAGE" in details
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod_name},
                "spec": {
                    "serviceAccountName": EXECUTOR,
                    "containers": [
                        {"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.30.3"},
                        {"name": "gateway", "image": image},
                    ],
                },
            }
            apiserver.kubectl(
                "create", f"--namespace={NAMESPACE}", "--filename=-", input=json.dumps(pod)
            )
            op = client.create(input_uri=str(setup["images"]))
            template = kube_job(apiserver, NAMESPACE, op.name)["spec"]["template"]
            (container,) = template["spec"]["containers"]
            assert container["image"] == image
        log = gw.log_path.read_text()
    assert "batch runner image unknown" in log  # said at startup, before any job
    assert "Traceback" not in log
