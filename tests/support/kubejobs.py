"""The Kubernetes Jobs the kubernetes executor creates, on envtest's API server, where no Job
controller runs: finding a batch job's Job and writing the status a controller would."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.support.apiserver import ApiServer

OPERATION_LABEL = "detection.gateway/operation"  # gateway/jobs/executors/kube.py labels its Jobs so


def kube_job(server: ApiServer, namespace: str, operation: str) -> dict[str, Any]:
    """The Kubernetes Job the executor created for `operation` (found by its label)."""
    listed = server.kubectl(
        "get", "jobs", f"--namespace={namespace}", "--output=json",
        f"--selector={OPERATION_LABEL}={operation.removeprefix('operations/')}",
    )  # fmt: skip
    (job,) = json.loads(listed.stdout)["items"]
    return dict(job)


def write_job_status(server: ApiServer, namespace: str, name: str, status: dict[str, Any]) -> None:
    """What the Job controller would write, through the status subresource."""
    server.kubectl(
        "patch", "job", name, f"--namespace={namespace}", "--subresource=status",
        "--type=merge", f"--patch={json.dumps({'status': status})}",
    )  # fmt: skip


def now() -> str:
    """The time as a Kubernetes status writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
