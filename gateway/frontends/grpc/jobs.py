"""detection.v1.BatchService and google.longrunning.Operations: convert and delegate to
gateway.jobs.service; the batch lane's loopback server for the local executor."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
from google.longrunning import operations_pb2 as lro
from google.longrunning import operations_pb2_grpc as lro_grpc
from google.protobuf import empty_pb2, json_format
from google.rpc import status_pb2

from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.frontends.api import Bindings, to_model_ref
from gateway.frontends.grpc.servicers import Drain, add_task_services
from gateway.jobs.local import BatchLane
from gateway.jobs.service import CreateParams, JobError, JobService, JobView
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.detection.v1 import batch_pb2 as bpb
from gateway.proto.detection.v1 import batch_pb2_grpc as bpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb

BATCH_SERVICE = bpb.DESCRIPTOR.services_by_name["BatchService"].full_name
OPERATIONS_SERVICE = lro.DESCRIPTOR.services_by_name["Operations"].full_name
_TASKS = {
    bpb.CreateBatchJobRequest.TASK_UNSPECIFIED: "detect",
    bpb.CreateBatchJobRequest.TASK_DETECT: "detect",
    bpb.CreateBatchJobRequest.TASK_CLASSIFY: "classify",
}
_STATE = bpb.BatchJobMetadata.State


def caller_of(context: grpc.aio.ServicerContext) -> str:
    """Who is calling, for per-caller limits: the client certificate's identity (mTLS), or
    the URI in Istio's x-forwarded-client-cert, else "anonymous"."""
    identities = context.peer_identities()
    if identities:
        return bytes(identities[0]).decode(errors="replace")
    for key, value in context.invocation_metadata() or ():
        if key == "x-forwarded-client-cert" and isinstance(value, str):
            for element in value.split(","):
                for pair in element.split(";"):
                    name, _, found = pair.partition("=")
                    if name.strip().lower() == "uri" and found:
                        return found.strip('"')
    return "anonymous"


async def _abort(context: grpc.aio.ServicerContext, error: JobError) -> None:
    code = getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)
    await context.abort(code, error.message)


def _timestamp(seconds: float | None) -> Any:
    from google.protobuf import timestamp_pb2

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
        output_uri=job.output_url,
        input_uri=job.input_url,
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
        if job.error is not None:
            operation.error.CopyFrom(
                status_pb2.Status(code=int(job.error["code"]), message=job.error["message"])
            )
        else:
            result = job.result or {}
            response = bpb.BatchJobResult(
                output_uri=job.output_url,
                result_files=list(result.get("files", [])),
                code_counts={k: int(n) for k, n in result.get("codes", {}).items()},
                total=int(result.get("total", 0)),
            )
            operation.response.Pack(response)
    return operation


def to_line(task: str, file: str, index: int, line: dict[str, Any], token: str) -> Any:
    out = bpb.BatchResultLine(file=file, line=index, source=str(line.get("source", "")))
    out.id = str(line.get("id", ""))
    out.page_token = token
    if line.get("metadata"):
        out.metadata.update(line["metadata"])
    if "result" in line:
        message: Any = cpb.ClassificationResult() if task == "classify" else pb.DetectionResult()
        json_format.ParseDict(line["result"], message, ignore_unknown_fields=True)
        out.result.Pack(message)
    elif "error" in line:
        code = getattr(grpc.StatusCode, str(line["error"].get("code")), grpc.StatusCode.UNKNOWN)
        out.error.code = code.value[0]
        out.error.message = str(line["error"].get("message", ""))
    return out


class BatchServicer(bpb_grpc.BatchServiceServicer):
    def __init__(self, jobs: JobService) -> None:
        self._jobs = jobs

    async def CreateBatchJob(
        self, request: bpb.CreateBatchJobRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        params = CreateParams(
            input_uri=request.input_uri,
            upload_id=request.upload_id,
            output_uri=request.output_uri,
            task=_TASKS.get(request.task, "unknown"),
            model=to_model_ref(request.model),
            min_score=request.min_score,
            max_detections=request.max_detections,
            top_k=request.top_k,
            shards=request.shards,
            request_id=request.request_id,
        )
        try:
            job = await self._jobs.create(caller_of(context), params)
            return to_operation(await self._jobs.current(job))
        except JobError as e:
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
            upload_id, count, size = await self._jobs.upload(images())
        except JobError as e:
            await _abort(context, e)
            raise
        return bpb.UploadImagesResponse(upload_id=upload_id, image_count=count, total_bytes=size)

    async def ReadBatchResults(
        self, request: bpb.ReadBatchResultsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bpb.BatchResultLine]:
        try:
            view = await self._jobs.get(request.name)
            task = view.job.params["task"]
            async for file, index, line, token in self._jobs.read(request.name, request.page_token):
                yield to_line(task, file, index, line, token)
        except JobError as e:
            await _abort(context, e)


class OperationsServicer(lro_grpc.OperationsServicer):
    def __init__(self, jobs: JobService) -> None:
        self._jobs = jobs

    async def GetOperation(
        self, request: lro.GetOperationRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        try:
            return to_operation(await self._jobs.get(request.name))
        except JobError as e:
            await _abort(context, e)
            raise

    async def ListOperations(
        self, request: lro.ListOperationsRequest, context: grpc.aio.ServicerContext
    ) -> lro.ListOperationsResponse:
        if request.name not in ("", "operations"):
            await context.abort(grpc.StatusCode.NOT_FOUND, "the only collection is 'operations'")
        try:
            views, token = await self._jobs.list(
                request.filter, request.page_size, request.page_token
            )
        except JobError as e:
            await _abort(context, e)
            raise
        return lro.ListOperationsResponse(
            operations=[to_operation(v) for v in views], next_page_token=token
        )

    async def CancelOperation(
        self, request: lro.CancelOperationRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        try:
            await self._jobs.cancel(request.name)
        except JobError as e:
            await _abort(context, e)
        return empty_pb2.Empty()

    async def DeleteOperation(
        self, request: lro.DeleteOperationRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        try:
            await self._jobs.delete(request.name)
        except JobError as e:
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
            view = await self._jobs.wait(request.name, min(limits) if limits else None)
        except JobError as e:
            await _abort(context, e)
            raise
        return to_operation(view)


def add_services(server: grpc.aio.Server, jobs: JobService) -> tuple[str, ...]:
    """Adds BatchService and Operations; returns their names for reflection and health."""
    bpb_grpc.add_BatchServiceServicer_to_server(BatchServicer(jobs), server)
    lro_grpc.add_OperationsServicer_to_server(OperationsServicer(jobs), server)
    return BATCH_SERVICE, OPERATIONS_SERVICE


def build_lane(
    settings: Settings, lane: BatchLane, bindings: Bindings
) -> tuple[grpc.aio.Server, int]:
    """The batch lane: the tasks' services over `lane` on a loopback port (not started yet),
    for the local executor's runner."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.server_max_receive_bytes),
            ("grpc.max_send_message_length", -1),
        ]
    )
    pipeline = cast(Pipeline, lane)  # the servicers use only run() and settings
    drain = Drain()  # the lane stops with the executor, not by draining
    add_task_services(server, bindings, pipeline, drain)
    port = server.add_insecure_port("127.0.0.1:0")
    return server, port
