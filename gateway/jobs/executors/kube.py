"""The `kubernetes` executor: one Indexed Job per batch job (k8s/jobs/batch's template).

The gateway creates the Job with the official `kubernetes` client (in-cluster config, or a
kubeconfig with --batch-kubeconfig), labelled with the operation id; pod i runs shard i of
the batch runner against the gateway's Service and writes to the job's output prefix. The
job's state is derived on every read from the Job's status and the shards' `_SUCCESS.SSSSS`
markers, and kept in the job store once it has ended, so every gateway replica sees the same
jobs. Cancel and Delete delete the Job (its pods go with it, propagationPolicy Background).

The runner pods run GATEWAY_BATCH_IMAGE; empty (the default) means the image of the gateway's
own pod, read once from the API server: the pod named by POD_NAME in POD_NAMESPACE (the
downward API; else the host name and the ServiceAccount's namespace), its container
`gateway` (or its only one). So the runners are the same release as the gateway without the
manifests repeating the image.

Calls made: create, get and delete of jobs in one namespace, get of the gateway's own pod —
within the Role of k8s/components/jobs (create/get/list/watch/delete jobs, get/list pods).

This module imports `kubernetes`; the gateway imports it only with that executor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from gateway.api.arguments import option_args
from gateway.api.bindings import Binding
from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.jobs.control.admission import input_guard, job_limits
from gateway.jobs.control.executor import ExecutorError
from gateway.jobs.control.service import JobService
from gateway.jobs.executors.ending import finish
from gateway.jobs.runner import job as batch_job
from gateway.jobs.runner import progress as status
from gateway.jobs.runner import storage
from gateway.jobs.runner.output import Output
from gateway.jobs.spec.records import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Job

log = logging.getLogger("gateway.jobs")

OPERATION_LABEL = "detection.gateway/operation"
APP = "detection-batch"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
GATEWAY_CONTAINER = "gateway"  # the gateway's container in k8s/base/gateway.yaml
RUNNER_CONCURRENCY = 64  # as k8s/jobs/batch: per pod, against the gateway Service


def _message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message", ""))
    except ValueError:
        return str(error.body or "")


def job_name(job_id: str) -> str:
    return f"{APP}-{job_id}"


def runner_args(job: Job, settings: Settings, binding: Binding) -> list[str]:
    """The runner's command-line arguments (gateway.jobs.runner.__main__) for the job."""
    spec = job.spec
    model = spec.model
    args = [
        spec.input,
        spec.output,
        f"--target={settings.batch_runner_target}",
        f"--pipeline={spec.pipeline}" if spec.pipeline else f"--task={binding.verb}",
        f"--concurrency={RUNNER_CONCURRENCY}",
        f"--shard-count={spec.shards}",
    ]
    if spec.format != "auto":
        args.append(f"--format={spec.format}")
    if model.name and not spec.pipeline:  # (a pipeline's config names its models)
        args.append(f"--model={model.name}")
    if model.version is not None:
        args.append(f"--version={model.version}")
    if model.label is not None:
        args.append(f"--label={model.label}")
    # Whose job it is, when the gateway knows the pods' identity (GATEWAY_BATCH_RUNNER_IDENTITIES).
    if settings.batch_runner_identities.strip():
        args.append(f"--owner={job.caller}")
    args += option_args(spec.options)  # one shape for every task's (runner-policy.yaml)
    # The pods read only where a job started through the API may read.
    guard = input_guard(settings, job)
    args.append(f"--allowed-input-uris={','.join(guard.urls())}")
    args.append(f"--fenced-uris={','.join(guard.fence_urls())}")
    # ... no more than the gateway's limits let one job read (lines and records: per shard).
    args += job_limits(settings, job).flags()
    return args


def own_pod() -> tuple[str, str]:
    """The gateway's own pod, (namespace, name): from the downward API (POD_NAMESPACE,
    POD_NAME), else the ServiceAccount's namespace and the host name (a pod's host name is its
    name unless its spec sets another)."""
    name = os.environ.get("POD_NAME") or socket.gethostname()
    return os.environ.get("POD_NAMESPACE") or _own_namespace(), name


def container_image(pod: Any) -> str:
    """The image of the gateway's container in `pod` (a V1Pod): the one named `gateway`,
    else the pod's only container; ValueError when neither is there."""
    containers = pod.spec.containers or []
    named = [c for c in containers if c.name == GATEWAY_CONTAINER]
    chosen = named or (containers if len(containers) == 1 else [])
    if not chosen or not chosen[0].image:
        names = ", ".join(c.name for c in containers) or "none"
        raise ValueError(
            f"it has no container named {GATEWAY_CONTAINER!r} and not exactly one container "
            f"(containers: {names})"
        )
    return str(chosen[0].image)


def _pair(text: str) -> tuple[str, str]:
    request, _, limit = text.partition(",")
    return request.strip(), (limit or request).strip()


def job_manifest(
    job: Job, settings: Settings, namespace: str, binding: Binding, image: str
) -> dict[str, Any]:
    """The Indexed Job for `job`: k8s/jobs/batch/job.yaml with this job's values, its pods
    running `image`."""
    cpu, memory = _pair(settings.batch_cpu), _pair(settings.batch_memory)
    labels = {"app": APP, OPERATION_LABEL: job.id, "app.kubernetes.io/part-of": "detection"}
    hardening = {"runAsNonRoot": True, "runAsUser": 10001}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(job.id), "namespace": namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": job.shards,
            "parallelism": min(settings.batch_parallelism, job.shards),
            "backoffLimitPerIndex": 3,
            "maxFailedIndexes": min(10, job.shards),
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailIndex",
                        "onExitCodes": {"containerName": "batch", "operator": "In", "values": [2]},
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "ttlSecondsAfterFinished": 604800,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"sidecar.istio.io/nativeSidecar": "true"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": APP,
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {
                        **hardening,
                        "runAsGroup": 10001,
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "batch",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["detection-batch"],
                            "args": runner_args(job, settings, binding),
                            "envFrom": [
                                {
                                    "secretRef": {
                                        "name": "detection-batch-credentials",
                                        "optional": True,
                                    }
                                }
                            ],
                            "resources": {
                                "requests": {"cpu": cpu[0], "memory": memory[0]},
                                "limits": {"cpu": cpu[1], "memory": memory[1]},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                **hardening,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                },
            },
        },
    }


class KubernetesExecutor:
    name = "kubernetes"

    def __init__(self, service: JobService, settings: Settings) -> None:
        self._service = service
        self._settings = settings
        configuration = k8s.Configuration()
        if settings.batch_kubeconfig:
            k8s_config.load_kube_config(
                config_file=settings.batch_kubeconfig, client_configuration=configuration
            )
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)
        _bearer_token(configuration)
        self._api = k8s.ApiClient(configuration)
        self._batch = k8s.BatchV1Api(self._api)
        self.namespace = settings.batch_namespace or _own_namespace()
        self._image = settings.batch_image  # empty until read from the gateway's own pod

    async def start(self, jobs: list[Job]) -> None:
        """Jobs whose Kubernetes Job was never created (a crash in between) get it now."""
        if not self._image:
            try:
                await self.runner_image()
            except ExecutorError as e:  # said at once; each job creation tries again
                log.error("batch runner image unknown", extra={"fields": {"error": str(e)}})
                return  # those jobs get their Job at the next start
        for job in jobs:
            if job.state == QUEUED and not job.cancel_requested:
                await self.submit(job)

    async def runner_image(self) -> str:
        """GATEWAY_BATCH_IMAGE, or when it is empty the image of the gateway's own pod."""
        if not self._image:
            namespace, name = own_pod()
            core = k8s.CoreV1Api(self._api)
            where = f"the gateway's own Pod {namespace}/{name}"
            try:
                pod = await asyncio.to_thread(core.read_namespaced_pod, name, namespace)
                self._image = container_image(pod)
            except ApiException as e:
                raise ExecutorError(
                    f"GATEWAY_BATCH_IMAGE is empty, so runner pods run the image of {where}, "
                    f"but the Kubernetes API refused to read it: {e.status} {e.reason}: "
                    f"{_message(e)}; set POD_NAME and POD_NAMESPACE from the downward API "
                    "(k8s/components/jobs does) and allow `get pods` to the gateway's "
                    "ServiceAccount, or set GATEWAY_BATCH_IMAGE"
                ) from None
            except ValueError as e:
                raise ExecutorError(
                    f"GATEWAY_BATCH_IMAGE is empty, so runner pods run the image of {where}, "
                    f"but {e}; set GATEWAY_BATCH_IMAGE"
                ) from None
            log.info("batch runner image", extra={"fields": {"image": self._image, "pod": name}})
        return self._image

    async def submit(self, job: Job) -> None:
        binding = job.spec.binding(self._service.bindings)
        image = await self.runner_image()
        manifest = job_manifest(job, self._settings, self.namespace, binding, image)
        try:
            await asyncio.to_thread(self._batch.create_namespaced_job, self.namespace, manifest)
        except ApiException as e:
            if e.status != 409:  # 409: created before (a retry, or another replica)
                raise ExecutorError(
                    f"the Kubernetes API refused to create Job {job_name(job.id)} in "
                    f"namespace {self.namespace}: {e.status} {e.reason}: {_message(e)}"
                ) from None
        log.info(
            "batch Job created",
            extra={"fields": {"operation": job.name, "job": manifest["metadata"]["name"]}},
        )
        if job.kube_job != job_name(job.id):
            job.kube_job = job_name(job.id)
            await self._service.save(job)

    async def _delete_job(self, job: Job) -> None:
        try:
            await asyncio.to_thread(
                self._batch.delete_namespaced_job,
                job_name(job.id),
                self.namespace,
                propagation_policy="Background",
            )
        except ApiException as e:
            if e.status != 404:
                raise

    async def cancel(self, job: Job) -> None:
        await self._delete_job(job)
        await finish(
            self._service, job, CANCELLED, GatewayError(Kind.CANCELLED, "cancelled by the caller")
        )

    async def delete(self, job: Job) -> None:
        await self._delete_job(job)

    async def close(self) -> None:
        await asyncio.to_thread(self._api.close)

    async def refresh(self, job: Job) -> Job:
        """The job's state from its Job's status and the shards' markers."""
        if job.done:
            return job
        if job.cancel_requested:
            await self.cancel(job)
            return await self._reload(job)
        found = await asyncio.to_thread(status.read, job.spec.output, job.units, job.shards)
        try:
            kube_status = (
                await asyncio.to_thread(
                    self._batch.read_namespaced_job, job_name(job.id), self.namespace
                )
            ).status
        except ApiException as e:
            if e.status != 404:
                raise
            kube_status = None
        if all(found.shards_done):
            out = Output(storage.resolve(job.spec.output))
            await asyncio.to_thread(batch_job.finalize_if_complete, out)
            await finish(self._service, job, SUCCEEDED, None, found)
            return await self._reload(job)
        if kube_status is None:
            if job.kube_job:
                message = f"the Kubernetes Job {job_name(job.id)} was deleted outside the API"
                await finish(self._service, job, FAILED, GatewayError(Kind.ABORTED, message), found)
                return await self._reload(job)
            return job
        for condition in kube_status.conditions or ():
            if condition.type == "Failed" and condition.status == "True":
                failed = kube_status.failed_indexes
                failed = f"; failed shards: {failed}" if failed else ""
                message = (
                    f"Kubernetes Job {job_name(job.id)} failed ({condition.reason}: "
                    f"{condition.message or 'no message'}){failed}; shards that finished keep "
                    "their results"
                )
                await finish(
                    self._service, job, FAILED, GatewayError(Kind.PRECONDITION, message), found
                )
                return await self._reload(job)
        started = kube_status.start_time is not None or (kube_status.active or 0) > 0
        if job.state == QUEUED and (started or found.processed > 0):
            job.state = RUNNING
            job.start_time = (
                kube_status.start_time.timestamp()
                if kube_status.start_time is not None
                else time.time()
            )
            await self._service.save(job)
        return job

    async def _reload(self, job: Job) -> Job:
        fresh = await asyncio.to_thread(self._service.store.load, job.id)
        return fresh or job


def _bearer_token(configuration: Any) -> None:
    """The config loaders of kubernetes 36 put the token under api_key['authorization'], but
    its generated client sends only api_key['BearerToken'] (else the calls go anonymous).
    Copy it over, also after each refresh of an in-cluster (rotating) token."""
    loaded = configuration.refresh_api_key_hook

    def refresh(c: Any) -> None:
        if loaded is not None:
            loaded(c)
        if "authorization" in c.api_key:
            c.api_key["BearerToken"] = c.api_key["authorization"]

    configuration.refresh_api_key_hook = refresh
    refresh(configuration)


def _own_namespace() -> str:
    try:
        return NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"
