"""The kubectl blocks of the docs (marked `<!-- command: envtest -->`, tests/support/
doccommands.py) on envtest's API server: as printed, with KUBECONFIG naming the server;
what would change a cluster (create, apply, delete, patch, ...) gets --dry-run=server, so
the server validates and admits it without keeping it. The reads find what the gateway's
kubernetes executor makes: a Job it built for a batch job (job_manifest of
gateway/jobs/executors/kube.py), whose id stands for the docs' `<id>`, with the status a Job
controller would write.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.config import Settings
from gateway.domain import ModelRef
from gateway.jobs.executors import kube
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job
from gateway.tasks.builtin import BUILT_IN
from tests.support import doccommands
from tests.support.apiserver import ApiServer
from tests.support.doccommands import Block
from tests.support.docworkspace import Workspace, problems, run_block
from tests.support.kubejobs import write_job_status

BLOCKS = doccommands.command_blocks("envtest")
NAMESPACE = "detection"  # the namespace the docs' commands name (k8s/overlays/prod)
JOB_ID = "0d5c1e2f3a4b5c6d7e8f9a0b"
COMPLETED = "0-1"
# kubectl's verbs that change a cluster: run with --dry-run=server.
CHANGES = re.compile(
    r"\bkubectl\b(?:\s+-n\s+\S+)?\s+(create|apply|delete|patch|replace|label|annotate|set|scale)\b"
)


@pytest.fixture(scope="module")
def cluster_job(apiserver: ApiServer) -> str:
    """The docs' namespace and a Job of the kubernetes executor in it; its id."""
    apiserver.kubectl("create", "namespace", NAMESPACE, check=False)
    spec = JobSpec(input="s3://bucket/street/", output="s3://bucket/street-results/",
                   task="detection", model=ModelRef("detector", None), options={},
                   format="images", shards=2)  # fmt: skip
    job = Job(id=JOB_ID, caller="spiffe://cluster.local/ns/a/sa/b", spec=spec,
              executor="kubernetes", units=[], total=None, upload_id="")  # fmt: skip
    settings = Settings(batch_runner_target="detection-gateway:50051")
    manifest = kube.job_manifest(job, settings, NAMESPACE, spec.binding(BUILT_IN), "gateway:1")
    apiserver.kubectl("apply", "--filename=-", input=json.dumps(manifest))
    write_job_status(apiserver, NAMESPACE, kube.job_name(JOB_ID),
                     {"completedIndexes": COMPLETED, "succeeded": 2})  # fmt: skip
    return JOB_ID


def rewrite(text: str) -> str:
    text = text.replace("<id>", JOB_ID)
    return f"{text} --dry-run=server" if CHANGES.search(text) else text


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_the_kubectl_block_runs_on_the_api_server(
    block: Block, apiserver: ApiServer, cluster_job: str, tmp_path: Path
) -> None:
    workspace = Workspace(tmp_path, env={"KUBECONFIG": str(apiserver.kubeconfig)}, files=False)
    found = []
    for command, outcome in run_block(workspace, block, rewrite):
        found += problems(block, command, outcome)
        assert command is not None
        if "get job " in command.text and "completedIndexes" in command.text:
            assert outcome.stdout == COMPLETED, outcome.report()
        elif "get jobs -l" in command.text:
            assert kube.job_name(cluster_job) in outcome.stdout, outcome.report()
        if CHANGES.search(command.text):
            assert "(server dry run)" in outcome.stdout, outcome.report()
    assert not found, "\n\n".join(found)
