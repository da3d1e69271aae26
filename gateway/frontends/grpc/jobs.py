"""detection.v1.BatchService and google.longrunning.Operations: convert and delegate to
gateway.jobs.service, answering failures through the door's status table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.longrunning import operations_pb2 as lro
from google.longrunning import operations_pb2_grpc as lro_grpc
from google.protobuf import empty_pb2, json_format, timestamp_pb2
from google.rpc import code_pb2, status_pb2

from gateway import identity
from gateway.batch.spec import JobSpec
from gateway.errors import GatewayError
from gateway.frontends.api import Bindings, to_model_ref
from gateway.frontends.grpc.status import STATUS
from gateway.jobs.admission import Request
from gateway.jobs.service import JobService
from gateway.jobs.views import JobView
from gateway.proto.detection.v1 import batch_pb2 as bpb
from gateway.proto.detection.v1 import batch_pb2_grpc as bpb_grpc

BATCH_SERVICE = bpb.DESCRIPTOR.services_by_name["BatchService"].full_name
OPERATIONS_SERVICE = lro.DESCRIPTOR.services_by_name["Operations"].full_name
_TASK = bpb.CreateBatchJobRequest.Task
_STATE = bpb.BatchJobMetadata.State
_CODES = dict(code_pb2.Code.items())  # canonical status names (as result lines hold) -> numbers


def caller_of(context: grpc.aio.ServicerContext, trust_xfcc: bool) -> str:
    """Who is calling (gateway.identity): the client certificate in the auth context, or a
    trusted x-forwarded-client-cert header."""
    certificate = identity.from_auth_context(context.auth_context())
    header = None
    for key, value in context.invocation_metadata() or ():
        if key == identity.XFCC and isinstance(value, str):
            header = value
    return identity.caller(certificate, header, trust_xfcc)


async def _abort(context: grpc.aio.ServicerContext, error: GatewayError) -> None:
    await context.abort(STATUS[error.kind], error.message)


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
            code = STATUS[failure.kind].value[0]
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
        out.error.code = _CODES.get(name, code_pb2.UNKNOWN)
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


class BatchServicer(bpb_grpc.BatchServiceServicer):
    def __init__(self, jobs: JobService) -> None:
        self._jobs = jobs
        self._trust_xfcc = jobs.settings.trust_xfcc

    async def CreateBatchJob(
        self, request: bpb.CreateBatchJobRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        try:
            caller = caller_of(context, self._trust_xfcc)
            job = await self._jobs.create(caller, to_request(request, self._jobs.bindings))
            return to_operation(await self._jobs.current(job))
        except GatewayError as e:
            await _abort(context, e)
            raise  # unreachable: abort raises

    async def UploadImages(
        self,
        request_iterator: AsyncIterator[bpb.UploadImagesRequest],
        context: grpc.aio.ServicerContext,
    ) -> bpb.UploadImagesResponse:
        async def images() -> AsyncIterator[tuple[str, str, bytes]]:
            async for message in request_iterator:
                yield message.upload_id, message.name, message.image

        try:
            caller = caller_of(context, self._trust_xfcc)
            upload_id, count, size = await self._jobs.upload(caller, images())
        except GatewayError as e:
            await _abort(context, e)
            raise
        return bpb.UploadImagesResponse(upload_id=upload_id, image_count=count, total_bytes=size)

    async def ReadBatchResults(
        self, request: bpb.ReadBatchResultsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bpb.BatchResultLine]:
        caller = caller_of(context, self._trust_xfcc)
        try:
            async for job, file, index, line, token in self._jobs.read(
                caller, request.name, request.page_token
            ):
                result_type = self._jobs.bindings.for_task(job.spec.task).result_type
                yield to_line(result_type, file, index, line, token)
        except GatewayError as e:
            await _abort(context, e)


class OperationsServicer(lro_grpc.OperationsServicer):
    def __init__(self, jobs: JobService) -> None:
        self._jobs = jobs
        self._trust_xfcc = jobs.settings.trust_xfcc

    def _caller(self, context: grpc.aio.ServicerContext) -> str:
        return caller_of(context, self._trust_xfcc)

    async def GetOperation(
        self, request: lro.GetOperationRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        try:
            return to_operation(await self._jobs.get(self._caller(context), request.name))
        except GatewayError as e:
            await _abort(context, e)
            raise

    async def ListOperations(
        self, request: lro.ListOperationsRequest, context: grpc.aio.ServicerContext
    ) -> lro.ListOperationsResponse:
        if request.name not in ("", "operations"):
            await context.abort(grpc.StatusCode.NOT_FOUND, "the only collection is 'operations'")
        try:
            views, token = await self._jobs.list(
                self._caller(context), request.filter, request.page_size, request.page_token
            )
        except GatewayError as e:
            await _abort(context, e)
            raise
        return lro.ListOperationsResponse(
            operations=[to_operation(v) for v in views], next_page_token=token
        )

    async def CancelOperation(
        self, request: lro.CancelOperationRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        try:
            await self._jobs.cancel(self._caller(context), request.name)
        except GatewayError as e:
            await _abort(context, e)
        return empty_pb2.Empty()

    async def DeleteOperation(
        self, request: lro.DeleteOperationRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        try:
            await self._jobs.delete(self._caller(context), request.name)
        except GatewayError as e:
            await _abort(context, e)
        return empty_pb2.Empty()

    async def WaitOperation(
        self, request: lro.WaitOperationRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        limits = []
        if request.HasField("timeout"):
            limits.append(request.timeout.ToTimedelta().total_seconds())
        remaining = context.time_remaining()
        if remaining is not None:
            limits.append(max(0.0, remaining - 0.05))  # answer before the caller gives up
        try:
            view = await self._jobs.wait(
                self._caller(context), request.name, min(limits) if limits else None
            )
        except GatewayError as e:
            await _abort(context, e)
            raise
        return to_operation(view)


def add_services(server: grpc.aio.Server, jobs: JobService) -> tuple[str, ...]:
    """Adds BatchService and Operations; returns their names for reflection and health."""
    bpb_grpc.add_BatchServiceServicer_to_server(BatchServicer(jobs), server)
    lro_grpc.add_OperationsServicer_to_server(OperationsServicer(jobs), server)
    return BATCH_SERVICE, OPERATIONS_SERVICE
