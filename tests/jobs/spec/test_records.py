"""A job's record: what the job store keeps, read back as written. A job created through the
jobs API's earlier name, detection.v1.BatchService, says so (`legacy_api`); any other job's
record has no such key, so replicas of the earlier version, which refuse keys they do not
know, can read it while both share a store during a rolling upgrade."""

from __future__ import annotations

import json

from gateway.domain import ModelRef
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.conversions import to_operation
from gateway.jobs.spec.records import SUCCEEDED, Job
from gateway.jobs.spec.views import JobView
from gateway.proto.detection.v1 import batch_pb2 as earlier
from gateway.proto.vision.v1 import batch_pb2 as bpb

# The keys of a record as the earlier version wrote it.
EARLIER_KEYS = {
    "id", "caller", "spec", "executor", "units", "total", "request_id", "fingerprint",
    "upload_id", "default_output", "state", "error", "result", "final", "create_time",
    "start_time", "update_time", "end_time", "cancel_requested", "kube_job", "generation",
    "deleted", "charged", "runner_deaths",
}  # fmt: skip


def job(**fields: object) -> Job:
    spec = JobSpec(input="/data", output="/out", task="detection", model=ModelRef("detector"))
    return Job(id="ab12", caller="team-a", spec=spec, executor="local", units=[(0, "r.jsonl")],
               total=3, **fields)  # type: ignore[arg-type]  # fmt: skip


def test_a_record_reads_back_as_written_and_names_its_api_only_when_it_is_the_earlier() -> None:
    current, legacy = job(), job(legacy_api=True)
    assert set(json.loads(current.to_json())) == EARLIER_KEYS
    assert json.loads(legacy.to_json())["legacy_api"] is True
    assert Job.from_json(current.to_json()) == current
    assert Job.from_json(legacy.to_json()) == legacy


def test_an_operation_packs_its_types_under_the_names_of_the_api_that_created_it() -> None:
    def operation(**fields: object) -> object:
        done = job(state=SUCCEEDED, result={"files": ["r.jsonl"], "codes": {"OK": 3}, "total": 3},
                   create_time=1.0, update_time=2.0, end_time=2.0, **fields)  # fmt: skip
        return to_operation(JobView(done, total=3, processed=3, failed=0, shards=[]))

    current, legacy = operation(), operation(legacy_api=True)
    assert current.metadata.Is(bpb.BatchJobMetadata.DESCRIPTOR)
    assert current.response.Is(bpb.BatchJobResult.DESCRIPTOR)
    assert legacy.metadata.Is(earlier.BatchJobMetadata.DESCRIPTOR)
    assert legacy.response.Is(earlier.BatchJobResult.DESCRIPTOR)
    # The same bytes under either name.
    assert legacy.metadata.value == current.metadata.value
    assert legacy.response.value == current.response.value
    result = earlier.BatchJobResult()
    assert legacy.response.Unpack(result) and dict(result.code_counts) == {"OK": 3}
