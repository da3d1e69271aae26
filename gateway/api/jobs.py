"""The jobs API's messages <-> the job service's plain types, for every door: a
CreateBatchJobRequest becomes the service's Request (a JobSpec), a job's view becomes a
google.longrunning.Operation, a result line a BatchResultLine. No transport here: the gRPC
door sends these messages as they are, the HTTP door as their proto3 JSON."""

from __future__ import annotations

from typing import Any

from google.longrunning import operations_pb2 as lro
from google.protobuf import json_format, timestamp_pb2
from google.rpc import code_pb2, status_pb2

from gateway.api.bindings import Bindings, to_model_ref
from gateway.batch.spec import JobSpec
from gateway.jobs.admission import Request
from gateway.jobs.views import JobView
from gateway.proto.detection.v1 import batch_pb2 as bpb

_TASK = bpb.CreateBatchJobRequest.Task
_STATE = bpb.BatchJobMetadata.State
# Canonical status names (what errors.Kind.code and result lines hold) -> google.rpc.Code.
CODES = dict(code_pb2.Code.items())


def upload_timeout(limit: float) -> str:
    """What both doors say when an upload call passes GATEWAY_BATCH_UPLOAD_TIMEOUT."""
    return (
        f"the upload did not arrive whole within {limit:g} s (GATEWAY_BATCH_UPLOAD_TIMEOUT); "
        "send fewer images per call and add the rest to the upload with its upload_id"
    )


def _timestamp(seconds: float | None) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    if seconds is not None:
        stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def to_operation(v: JobView) -> lro.Operation:
    job = v.job
    metadata = bpb.BatchJobMetadata(
        state=_STATE.Value(job.state),
        total=v.total,
        processed=v.processed,
        failed=v.failed,
        shards=[
            bpb.ShardProgress(index=s.index, processed=s.processed, failed=s.failed, done=s.done)
            for s in v.shards
        ],
        output_uri=job.spec.output,
        input_uri=job.spec.input,
    )
    metadata.create_time.CopyFrom(_timestamp(job.create_time))
    metadata.update_time.CopyFrom(_timestamp(job.update_time))
    if job.start_time is not None:
        metadata.start_time.CopyFrom(_timestamp(job.start_time))
    if job.end_time is not None:
        metadata.end_time.CopyFrom(_timestamp(job.end_time))
    operation = lro.Operation(name=job.name, done=job.done)
    operation.metadata.Pack(metadata)
    if job.done:
        failure = job.failure
        if failure is not None:
            code = CODES[failure.kind.code]
            operation.error.CopyFrom(status_pb2.Status(code=code, message=failure.message))
        else:
            result = job.result or {}
            response = bpb.BatchJobResult(
                output_uri=job.spec.output,
                result_files=list(result.get("files", [])),
                code_counts={k: int(n) for k, n in result.get("codes", {}).items()},
                total=int(result.get("total", 0)),
            )
            operation.response.Pack(response)
    return operation


def to_line(
    result_type: Any, file: str, index: int, line: dict[str, Any], token: str
) -> bpb.BatchResultLine:
    """A result line as the API shows it; `result_type` is the task's result message."""
    out = bpb.BatchResultLine(file=file, line=index, source=str(line.get("source", "")))
    out.id = str(line.get("id", ""))
    out.page_token = token
    if line.get("metadata"):
        out.metadata.update(line["metadata"])
    if "result" in line:
        message = result_type()
        json_format.ParseDict(line["result"], message, ignore_unknown_fields=True)
        out.result.Pack(message)
    elif "error" in line:
        name = str(line["error"].get("code"))
        out.error.code = CODES.get(name, code_pb2.UNKNOWN)
        out.error.message = str(line["error"].get("message", ""))
    return out


def task_of(request: bpb.CreateBatchJobRequest, bindings: Bindings) -> str:
    """The task the request's enum names (TASK_<VERB>; unset: the first binding's)."""
    if request.task == _TASK.TASK_UNSPECIFIED:
        return next(iter(bindings)).task
    name = _TASK.Name(request.task) if request.task in _TASK.values() else str(request.task)
    try:
        return bindings.for_verb(name.removeprefix("TASK_").lower()).task
    except KeyError:
        return name


def to_request(request: bpb.CreateBatchJobRequest, bindings: Bindings) -> Request:
    task = task_of(request, bindings)
    fields = request.DESCRIPTOR.fields_by_name
    options: dict[str, Any] = {}
    for binding in bindings:
        if binding.task == task:
            options = {n: getattr(request, n) for n in binding.options if n in fields}
    spec = JobSpec(
        input=request.input_uri,
        output=request.output_uri,
        task=task,
        model=to_model_ref(request.model),
        options=options,
        shards=request.shards or 1,
    )
    return Request(spec, request.upload_id, request.request_id)
