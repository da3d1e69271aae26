"""The prod overlay's batch jobs on a real API server (envtest), as a deployment runs them.

The gateway process gets the environment its pod would (the rendered Deployment's values and
the Secret it names, read back from the API server as the kubelet would) and authenticates
with a token of its own ServiceAccount, bound by the rendered RoleBinding. Only what a pod
gets from its surroundings is replaced: the ports, TF Serving's address, the model config's
path, and in-cluster configuration (a kubeconfig with the token, and the namespace). The job
store is the overlay's bucket on an S3 server on loopback (moto).

A job created through the gateway's API becomes a Kubernetes Job, which the test checks
against the namespace and then "runs" as the Job controller and kubelets would: it writes the
status a controller writes, and runs each shard's container command with the Job's own
arguments and environment. The gateway reports the job's state from the Job and the store,
and a second replica sharing the store answers for the same operation, over gRPC and over the
HTTP door.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import s3fs
import yaml
from google.longrunning import operations_pb2 as lro
from moto.server import ThreadedMotoServer

from gateway.proto.vision.v1 import batch_pb2 as bpb
from tests.support import runnerpolicy
from tests.support.apiserver import ApiServer
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.jobs import Client, State, make_images, metadata, result
from tests.support.kubejobs import kube_job, now, write_job_status
from tests.support.localserver import LocalServer, free_port, run_local_server
from tests.support.renders import GATEWAY, container, env_of, find, rendered
from tests.support.sidecar import sidecar

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "detection-jobs"
CREDENTIALS = "detection-batch-credentials"
IMAGES = 5


@pytest.fixture(scope="module")
def prod() -> list[dict[str, Any]]:
    return rendered("prod")


@pytest.fixture(scope="module")
def tfs(model_repo: Path) -> Iterator[LocalServer]:
    with run_local_server(
        ["--model_name=detector", f"--model_base_path={model_repo / 'detector'}"]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def in_namespace(obj: dict[str, Any]) -> dict[str, Any]:
    """The rendered object moved to this test's namespace."""
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("namespace", None)
    for subject in obj.get("subjects", []):
        subject["namespace"] = NAMESPACE
    return obj


@pytest.fixture(scope="module")
def deployed(
    apiserver: ApiServer, prod: list[dict[str, Any]], s3_endpoint: str, tmp_path_factory
) -> dict[str, Any]:
    """What deploying the prod overlay's jobs parts and following components/jobs/README.md
    leaves: the namespace (with the overlay's labels), the ServiceAccounts, Role and
    RoleBinding as rendered, the credentials' Secret, and the bucket. Returns the gateway's
    kubeconfig (its ServiceAccount's token) and the Secret's data."""
    namespace = in_namespace(find(prod, "Namespace", "detection"))
    namespace["metadata"]["name"] = NAMESPACE
    apiserver.kubectl("apply", "--filename=-", input=json.dumps(namespace))
    rbac = [
        in_namespace(o)
        for o in prod
        if o["kind"] in {"ServiceAccount", "Role", "RoleBinding"}
        and o["metadata"]["name"] != "tfserving"
    ]
    assert {(o["kind"], o["metadata"]["name"]) for o in rbac} == {
        ("ServiceAccount", GATEWAY),
        ("ServiceAccount", "detection-batch"),
        ("Role", "detection-batch-executor"),
        ("RoleBinding", "detection-batch-executor"),
    }
    apiserver.kubectl(
        "apply", f"--namespace={NAMESPACE}", "--filename=-", input=yaml.safe_dump_all(rbac)
    )
    # The Secret as components/jobs/README.md has the user create it, for an S3-compatible
    # store (here moto on loopback).
    secret = {
        "AWS_ACCESS_KEY_ID": "detection",
        "AWS_SECRET_ACCESS_KEY": "detection-secret",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
    }
    apiserver.kubectl(
        "create", "secret", "generic", CREDENTIALS, f"--namespace={NAMESPACE}",
        *(f"--from-literal={k}={v}" for k, v in secret.items()),
    )  # fmt: skip
    gateway_env = env_of(container(find(prod, "Deployment", GATEWAY), "gateway"), prod)
    store = gateway_env["GATEWAY_JOB_STORE"]
    bucket = re.fullmatch(r"s3://([^/]+)/.+", store)
    assert bucket, store
    fs = s3fs.S3FileSystem(
        key=secret["AWS_ACCESS_KEY_ID"],
        secret=secret["AWS_SECRET_ACCESS_KEY"],
        endpoint_url=s3_endpoint,
        skip_instance_cache=True,
    )
    fs.makedirs(bucket.group(1), exist_ok=True)  # the run's moto may have it already

    token = apiserver.kubectl(
        "create", "token", GATEWAY, f"--namespace={NAMESPACE}", "--duration=2h"
    ).stdout.strip()
    kubeconfig = tmp_path_factory.mktemp("gateway-pod") / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "envtest",
                        "cluster": {"server": apiserver.url, "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": GATEWAY, "user": {"token": token}}],
                "contexts": [
                    {"name": "envtest", "context": {"cluster": "envtest", "user": GATEWAY}}
                ],
                "current-context": "envtest",
            }
        )
    )
    # The runner policy, its binding and its ConfigMap (which the gateway's settings are read
    # from): the Jobs the gateway creates below are admitted by it, not merely created. A
    # copy bound to this namespace only, left in place (runnerpolicy.install says why).
    runnerpolicy.install(apiserver, NAMESPACE, prod, suffix="-jobs-cluster")
    return {"kubeconfig": kubeconfig, "fs": fs, "store": store}


def secret_data(server: ApiServer, name: str) -> dict[str, str]:
    """A Secret's data, decoded, as the kubelet hands it to a container's envFrom."""
    found = server.kubectl(
        "get", "secret", name, f"--namespace={NAMESPACE}", "--output=json", check=False
    )
    if found.returncode != 0:
        return {}
    data = json.loads(found.stdout).get("data", {})
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def container_env(
    server: ApiServer, spec: dict[str, Any], pod: dict[str, Any] | None = None
) -> dict[str, str]:
    """The environment the kubelet gives a container: envFrom Secrets, then env values, the
    ConfigMap keys it names and the downward API's fields of its `pod`."""
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        ref = source["secretRef"]
        data = secret_data(server, ref["name"])
        assert data or ref.get("optional"), f"Secret {ref['name']} is missing"
        env.update(data)
    for entry in spec.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"].get("configMapKeyRef")
        if ref is not None:
            found = server.kubectl(
                "get", "configmap", ref["name"], f"--namespace={NAMESPACE}", "--output=json"
            )
            env[entry["name"]] = json.loads(found.stdout)["data"][ref["key"]]
            continue
        ref = entry["valueFrom"].get("secretKeyRef")
        if ref is not None:  # as the kubelet: an optional Secret that is not there sets nothing
            found = server.kubectl("get", "secret", ref["name"], f"--namespace={NAMESPACE}",
                                   "--output=json", check=False)  # fmt: skip
            assert found.returncode == 0 or ref.get("optional"), f"Secret {ref['name']} is missing"
            if found.returncode == 0:
                value = json.loads(found.stdout)["data"][ref["key"]]
                env[entry["name"]] = base64.b64decode(value).decode()
            continue
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        assert pod is not None and path.startswith("metadata."), entry
        env[entry["name"]] = pod["metadata"][path.removeprefix("metadata.")]
    return env


@pytest.fixture(scope="module")
def gateway_pod(
    apiserver: ApiServer, prod: list[dict[str, Any]], deployed: dict[str, Any]
) -> dict[str, Any]:
    """One pod of the rendered Deployment, as its ReplicaSet would create it (no kubelet
    runs it here: the gateway process stands for it and reads it back for its image)."""
    template = find(prod, "Deployment", GATEWAY)["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": f"{GATEWAY}-7d4b9c-x2x5q"},
        "spec": template["spec"],
    }
    created = apiserver.kubectl(
        "create", f"--namespace={NAMESPACE}", "--output=json", "--filename=-",
        input=json.dumps(pod),
    )  # fmt: skip
    return dict(json.loads(created.stdout))


@pytest.fixture(scope="module")
def pod_env(
    apiserver: ApiServer, prod: list[dict[str, Any]], gateway_pod: dict[str, Any]
) -> Iterator[dict[str, str]]:
    """The gateway pod's environment, set for the gateway processes this module starts."""
    spec = container(find(prod, "Deployment", GATEWAY), "gateway")
    env = container_env(apiserver, spec, gateway_pod)
    assert env["GATEWAY_BATCH_EXECUTOR"] == "kubernetes"
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(("GATEWAY_", "AWS_", "FSSPEC_")):
                patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        yield env


# In a pod: in-cluster configuration (the mounted token and namespace) and the ConfigMap's
# model config; here a kubeconfig with the same account's token, and the repository's copy.
def pod_surroundings(deployed: dict[str, Any]) -> list[str]:
    return [
        f"--batch-kubeconfig={deployed['kubeconfig']}",
        f"--batch-namespace={NAMESPACE}",
        f"--model-config={ROOT / 'k8s' / 'base' / 'config' / 'gateway-models.toml'}",
    ]


@pytest.fixture(scope="module")
def gateway(
    tfs: LocalServer, pod_env: dict[str, str], deployed: dict[str, Any], tmp_path_factory
) -> Iterator[GatewayProcess]:
    log_dir = tmp_path_factory.mktemp("gateway-logs")
    with run_gateway(tfs.target, pod_surroundings(deployed), log_dir=log_dir) as process:
        yield process


def run_shard(server: ApiServer, job: dict[str, Any], index: int, target: str) -> None:
    """One pod of the Indexed Job: its container's command and arguments, with the
    environment the kubelet gives it (its Secret, JOB_COMPLETION_INDEX); the gateway's Service
    is the gateway process on loopback."""
    (spec,) = job["spec"]["template"]["spec"]["containers"]
    assert spec["command"] == ["detection-batch"]
    args = [f"--target={target}" if a.startswith("--target=") else a for a in spec["args"]]
    env = {
        **container_env(server, spec),
        "JOB_COMPLETION_INDEX": str(index),
        "PATH": os.environ["PATH"],
    }
    done = subprocess.run(
        [sys.executable, "-m", "gateway.jobs.runner", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


# Prod trusts x-forwarded-client-cert (components/istio): the test is the caller's sidecar,
# which appends the caller's verified mesh identity as the header's last element.
CALLER = (("x-forwarded-client-cert", "By=spiffe://cluster.local/ns/detection/sa/gw;URI="
           "spiffe://cluster.local/ns/shop/sa/batch-user"),)  # fmt: skip


def upload(client: Client, tmp_path: Path) -> str:
    paths = make_images(tmp_path / "images", IMAGES)
    requests = (bpb.UploadImagesRequest(name=p.name, image=p.read_bytes()) for p in paths)
    answer = client.batch.UploadImages(requests, timeout=60, metadata=client.metadata)
    assert answer.image_count == IMAGES
    return str(answer.upload_id)


def test_a_job_created_through_the_api_runs_as_a_kubernetes_job_and_reports_from_it(
    apiserver: ApiServer,
    prod: list[dict[str, Any]],
    deployed: dict[str, Any],
    pod_env: dict[str, str],
    tfs: LocalServer,
    gateway: GatewayProcess,
    tmp_path: Path,
) -> None:
    with gateway.channel() as channel:
        client = Client(channel, CALLER)
        op = client.create(upload_id=upload(client, tmp_path), shards=2)
        assert metadata(op).state == State.QUEUED

        # The Job, created by the gateway as its own ServiceAccount.
        job = kube_job(apiserver, NAMESPACE, op.name)
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        (spec,) = pod["containers"]
        # The same release as the gateway: the image of its pod's container, read back.
        assert pod_env["GATEWAY_BATCH_IMAGE"] == ""
        gateway_image = container(find(prod, "Deployment", GATEWAY), "gateway")["image"]
        assert spec["image"] == gateway_image
        apiserver.kubectl("get", "serviceaccount", pod["serviceAccountName"], "-n", NAMESPACE)
        assert [s["secretRef"]["name"] for s in spec["envFrom"]] == [CREDENTIALS]
        assert metadata(op).output_uri.startswith(deployed["store"])
        # Its pods would pass the namespace's Pod Security level (`restricted`, warn mode):
        # a server-side dry run of the same Job under another name gives no warning.
        job["metadata"] = {"name": f"{name}-check", "labels": job["metadata"]["labels"]}
        job.pop("status", None)
        for key in ("selector", "manualSelector"):
            job["spec"].pop(key, None)
        labels = job["spec"]["template"]["metadata"]["labels"]
        for key in [k for k in labels if "controller-uid" in k or "job-name" in k]:
            labels.pop(key)
        checked = apiserver.kubectl(
            "create", "--dry-run=server", f"--namespace={NAMESPACE}", "--filename=-",
            input=json.dumps(job),
        )  # fmt: skip
        assert checked.stderr.strip() == "", checked.stderr

        # State from the Job's status, then from the shards' results in the bucket.
        write_job_status(apiserver, NAMESPACE, name, {"startTime": now(), "active": 2})
        assert metadata(client.get(op.name)).state == State.RUNNING
        stored = kube_job(apiserver, NAMESPACE, op.name)
        # The pods name the job's owner, and reach the gateway through their sidecar, which
        # gives their calls the runner identity the gateway takes an owner from.
        assert "--owner=uri:spiffe://cluster.local/ns/shop/sa/batch-user" in spec["args"]
        runner = pod_env["GATEWAY_BATCH_RUNNER_IDENTITIES"].removeprefix("uri:")
        with sidecar(gateway.target, runner) as target:
            run_shard(apiserver, stored, 0, target)
            found = metadata(client.get(op.name))
            assert found.state == State.RUNNING
            assert [s.done for s in found.shards] == [True, False]
            run_shard(apiserver, stored, 1, target)
        done = client.get(op.name)
        assert done.done and metadata(done).state == State.SUCCEEDED, done
        assert dict(result(done).code_counts) == {"OK": IMAGES}
        lines = client.lines(op.name)
        assert [x.id for x in lines] == [f"img-{i:05d}.jpg" for i in range(IMAGES)]
        # The results are in the bucket, under the job store's prefix.
        files = deployed["fs"].find(metadata(done).output_uri)
        assert any(f.endswith(".jsonl") for f in files), files

        # Another replica (same pod environment, same bucket) answers for the same operation,
        # on both doors.
        with (
            run_gateway(
                tfs.target, pod_surroundings(deployed), log_dir=tmp_path, http=True
            ) as other,
            other.channel() as other_channel,
        ):
            assert Client(other_channel, CALLER).get(op.name) == done
            as_caller = dict(CALLER)
            request = urllib.request.Request(f"{other.http_url}/v1/{op.name}", headers=as_caller)
            with urllib.request.urlopen(request, timeout=30) as answer:
                over_http = json.loads(answer.read())
            assert over_http["done"] is True
            assert over_http["metadata"]["state"] == "SUCCEEDED"
            assert over_http["response"]["code_counts"] == {"OK": str(IMAGES)}
            results = f"{other.http_url}/v1/{op.name}/results"
            request = urllib.request.Request(results, headers=as_caller)
            with urllib.request.urlopen(request, timeout=30) as answer:
                assert answer.headers["Content-Type"] == "application/x-ndjson"
                ids = [json.loads(line)["id"] for line in answer.read().splitlines()]
            assert ids == [x.id for x in lines]

        delete = lro.DeleteOperationRequest(name=op.name)
        client.ops.DeleteOperation(delete, timeout=30, metadata=CALLER)
    gone = apiserver.kubectl("get", "job", name, f"--namespace={NAMESPACE}", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
