"""The jobs API's messages <-> the job service's plain types, for every door: a
CreateBatchJobRequest becomes the service's CreateJob (a JobSpec), a job's view becomes a
google.longrunning.Operation, a result line a BatchResultLine. No transport here: the gRPC
door sends these messages as they are, the HTTP door as their proto3 JSON."""

from __future__ import annotations

import json
from typing import Any

from google.longrunning import operations_pb2 as lro
from google.protobuf import any_pb2, json_format, timestamp_pb2
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2

from gateway import errors
from gateway.api import pipelines
from gateway.api.bindings import Binding, Bindings, to_model_ref
from gateway.api.status import CODES
from gateway.domain import ModelRef
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.views import CreateJob, JobView
from gateway.proto.detection.v1 import batch_pb2 as legacy_bpb
from gateway.proto.vision.v1 import batch_pb2 as bpb

_STATE = bpb.BatchJobMetadata.State
# The earlier names of the Operation's metadata and response (Job.legacy_api): the
# same fields, so the same bytes under another type URL.
_LEGACY_NAMES = {
    bpb.BatchJobMetadata.DESCRIPTOR.full_name: legacy_bpb.BatchJobMetadata.DESCRIPTOR.full_name,
    bpb.BatchJobResult.DESCRIPTOR.full_name: legacy_bpb.BatchJobResult.DESCRIPTOR.full_name,
}


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


def _pack(into: any_pb2.Any, message: Message, legacy: bool) -> None:
    into.Pack(message)
    if legacy:
        name = _LEGACY_NAMES[message.DESCRIPTOR.full_name]
        into.type_url = into.type_url.rsplit("/", 1)[0] + "/" + name


def to_operation(v: JobView) -> lro.Operation:
    """The job as its Operation; one created through detection.v1.BatchService packs its
    metadata and response under their detection.v1 names (Job.legacy_api)."""
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
    _pack(operation.metadata, metadata, job.legacy_api)
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
            _pack(operation.response, response, job.legacy_api)
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


def binding_of(verb: str, bindings: Bindings, pipeline: str = "") -> Binding:
    """The binding of a CreateBatchJobRequest's `task` (a verb; empty: the first binding's),
    or the pipelines' when it names a `pipeline`; GatewayError INVALID_INPUT naming the verbs
    served for any other, or for a task given with a pipeline."""
    if pipeline:
        if verb:
            raise errors.invalid_input(
                f"task {verb!r} and pipeline {pipeline!r} are both set: a job runs a task's "
                "model or a pipeline (whose config names its models); set one"
            )
        return pipelines.binding(bindings)
    if not verb:
        return next(iter(bindings))
    try:
        return bindings.for_verb(verb)
    except KeyError:
        raise errors.invalid_input(
            f"task must be one of {', '.join(bindings.verbs)} (a task's verb, as in its HTTP "
            f"route), got {verb!r}"
        ) from None


def known_options(binding: Binding) -> str:
    return ", ".join(binding.options) or "none"


def options_of(request: bpb.CreateBatchJobRequest, binding: Binding) -> dict[str, Any]:
    """The task's options from the request's `options` (its request message in an Any):
    every option of the binding, 0 for those not set; GatewayError INVALID_INPUT for another
    message type, or one that sets image, model, request_id or a field that is no option."""
    message = binding.request_type()
    expected = message.DESCRIPTOR.full_name
    if request.HasField("options"):
        given = request.options.TypeName()
        if given != expected:
            raise errors.invalid_input(
                f"options must be a {expected} for task {binding.verb} (only its options set: "
                f"{known_options(binding)}), got {given or 'an Any without a type'}"
            )
        try:
            request.options.Unpack(message)
        except DecodeError:
            raise errors.invalid_input(f"options is not a valid {expected}") from None
    stray = [f.name for f, _ in message.ListFields() if f.name not in binding.options]
    if stray:
        raise errors.invalid_input(
            f"options sets {', '.join(stray)}: a job's options are the task's options only "
            f"({known_options(binding)}); the images come from input_uri or upload_id, the "
            "model and request_id are the CreateBatchJobRequest's own fields"
        )
    return {name: getattr(message, name) for name in binding.options}


def to_request(
    request: bpb.CreateBatchJobRequest, bindings: Bindings, legacy_api: bool = False
) -> CreateJob:
    """The service's CreateJob; `legacy_api`: the request came through the jobs API's
    earlier name, detection.v1.BatchService (Job.legacy_api)."""
    binding = binding_of(request.task, bindings, request.pipeline)
    model = to_model_ref(request.model)
    if request.pipeline:
        if request.HasField("model"):
            raise errors.invalid_input(
                f"model and pipeline {request.pipeline!r} are both set: a pipeline's config "
                "names its models; set one"
            )
        model = ModelRef(request.pipeline)
    spec = JobSpec(
        input=request.input_uri,
        output=request.output_uri,
        task=binding.task,
        model=model,
        options=options_of(request, binding),
        shards=request.shards or 1,
    )
    return CreateJob(spec, request.upload_id, request.request_id, legacy_api)


def from_json(body: bytes, bindings: Bindings) -> bpb.CreateBatchJobRequest:
    """The proto3 JSON of a CreateBatchJobRequest (the HTTP door's body), whose `options` may
    also be a plain object of the task's option fields (`{"min_score": 0.4}`): parsed into
    the task's request message, a field it does not have refused by name (never dropped).
    GatewayError INVALID_INPUT for anything else."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise errors.invalid_input("not a CreateBatchJobRequest: not JSON text") from None
    if not isinstance(data, dict):
        raise errors.invalid_input("not a CreateBatchJobRequest: not a JSON object")
    options = data.pop("options", None)
    message = bpb.CreateBatchJobRequest()
    try:
        json_format.ParseDict(data, message)
        if isinstance(options, dict) and "@type" not in options:
            binding = binding_of(message.task, bindings, message.pipeline)
            fields = binding.request_type.DESCRIPTOR.fields
            names = {f.name for f in fields} | {f.json_name for f in fields}
            unknown = sorted(str(k) for k in options if k not in names)
            if unknown:
                raise errors.invalid_input(
                    f"options.{unknown[0]} is not an option of task {binding.verb} (its "
                    f"options: {known_options(binding)})"
                )
            inner = binding.request_type()
            json_format.ParseDict(options, inner)
            message.options.Pack(inner)
        elif options is not None:
            json_format.ParseDict({"options": options}, message)
    except json_format.ParseError as e:
        raise errors.invalid_input(f"not a CreateBatchJobRequest: {e}") from None
    except RecursionError:
        raise errors.invalid_input("not a CreateBatchJobRequest: nested too deep") from None
    return message
