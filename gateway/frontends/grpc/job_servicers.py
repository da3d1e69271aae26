"""vision.v1.BatchService and google.longrunning.Operations over gRPC: the caller from the
auth context, conversions from gateway.jobs.spec.conversions, the work in
gateway.jobs.control.service, failures through the door's status table.

The service's earlier name, detection.v1.BatchService, is served too until the next
release: its messages have the same fields as vision.v1's, so the same servicer reads and
writes the same bytes under the old path (CHANGELOG.md, "Moving to vision.v1")."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
from google.longrunning import operations_pb2 as lro
from google.longrunning import operations_pb2_grpc as lro_grpc
from google.protobuf import empty_pb2, message_factory

from gateway import identity
from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.frontends.grpc.status import STATUS
from gateway.jobs.control.service import JobService
from gateway.jobs.spec.conversions import to_line, to_operation, to_request, upload_timeout
from gateway.proto.detection.v1 import batch_pb2 as legacy_bpb
from gateway.proto.vision.v1 import batch_pb2 as bpb
from gateway.proto.vision.v1 import batch_pb2_grpc as bpb_grpc

BATCH_SERVICE = bpb.DESCRIPTOR.services_by_name["BatchService"].full_name
LEGACY_BATCH_SERVICE = legacy_bpb.DESCRIPTOR.services_by_name["BatchService"].full_name
OPERATIONS_SERVICE = lro.DESCRIPTOR.services_by_name["Operations"].full_name

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")
Unary = Callable[[S, R, grpc.aio.ServicerContext], Awaitable[T]]


def caller_of(context: grpc.aio.ServicerContext, settings: Settings) -> str:
    """Who is calling (gateway.identity): the client certificate in the auth context, or a
    trusted x-forwarded-client-cert header; PERMISSION_DENIED for an anonymous caller
    unless GATEWAY_BATCH_ALLOW_ANONYMOUS."""
    found = identity.of_grpc(context, settings.trust_xfcc)
    return identity.for_jobs(found, settings.batch_allow_anonymous)


async def _abort(context: grpc.aio.ServicerContext, error: GatewayError) -> None:
    await context.abort(STATUS[error.kind], error.message)


def _answers_errors(method: Unary[S, R, T]) -> Unary[S, R, T]:
    """The unary method's GatewayError as the call's status (through the door's table)."""

    @functools.wraps(method)
    async def wrapped(self: S, request: R, context: grpc.aio.ServicerContext) -> T:
        try:
            return await method(self, request, context)
        except GatewayError as e:
            await _abort(context, e)
            raise  # unreachable: abort raises

    return wrapped


class BatchServicer(bpb_grpc.BatchServiceServicer):
    """`legacy`: serving the earlier name, detection.v1.BatchService (Job.legacy_api)."""

    def __init__(self, jobs: JobService, legacy: bool = False) -> None:
        self._jobs = jobs
        self._settings = jobs.settings
        self._legacy = legacy

    @_answers_errors
    async def CreateBatchJob(
        self, request: bpb.CreateBatchJobRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        caller = caller_of(context, self._settings)
        create = to_request(request, self._jobs.bindings, self._legacy)
        job = await self._jobs.create(caller, create)
        return to_operation(await self._jobs.current(job))

    @_answers_errors
    async def UploadImages(
        self,
        request_iterator: AsyncIterator[bpb.UploadImagesRequest],
        context: grpc.aio.ServicerContext,
    ) -> bpb.UploadImagesResponse:
        async def images() -> AsyncIterator[tuple[str, str, bytes]]:
            async for message in request_iterator:
                yield message.upload_id, message.name, message.image

        limit = self._settings.batch_upload_timeout
        caller = caller_of(context, self._settings)
        try:
            async with asyncio.timeout(limit):
                upload_id, count, size = await self._jobs.upload(caller, images())
        except TimeoutError:
            raise GatewayError(Kind.DEADLINE, upload_timeout(limit)) from None
        return bpb.UploadImagesResponse(upload_id=upload_id, image_count=count, total_bytes=size)

    async def ReadBatchResults(
        self, request: bpb.ReadBatchResultsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bpb.BatchResultLine]:
        try:
            caller = caller_of(context, self._settings)
            async for result_type, file, index, line, token in self._jobs.read(
                caller, request.name, request.page_token
            ):
                yield to_line(result_type, file, index, line, token)
        except GatewayError as e:
            await _abort(context, e)


class OperationsServicer(lro_grpc.OperationsServicer):
    def __init__(self, jobs: JobService) -> None:
        self._jobs = jobs
        self._settings = jobs.settings

    def _caller(self, context: grpc.aio.ServicerContext) -> str:
        return caller_of(context, self._settings)

    @_answers_errors
    async def GetOperation(
        self, request: lro.GetOperationRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        return to_operation(await self._jobs.get(self._caller(context), request.name))

    @_answers_errors
    async def ListOperations(
        self, request: lro.ListOperationsRequest, context: grpc.aio.ServicerContext
    ) -> lro.ListOperationsResponse:
        if request.name not in ("", "operations"):
            await context.abort(grpc.StatusCode.NOT_FOUND, "the only collection is 'operations'")
        views, token = await self._jobs.list(
            self._caller(context), request.filter, request.page_size, request.page_token
        )
        return lro.ListOperationsResponse(
            operations=[to_operation(v) for v in views], next_page_token=token
        )

    @_answers_errors
    async def CancelOperation(
        self, request: lro.CancelOperationRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        await self._jobs.cancel(self._caller(context), request.name)
        return empty_pb2.Empty()

    @_answers_errors
    async def DeleteOperation(
        self, request: lro.DeleteOperationRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        await self._jobs.delete(self._caller(context), request.name)
        return empty_pb2.Empty()

    @_answers_errors
    async def WaitOperation(
        self, request: lro.WaitOperationRequest, context: grpc.aio.ServicerContext
    ) -> lro.Operation:
        limits = []
        if request.HasField("timeout"):
            limits.append(request.timeout.ToTimedelta().total_seconds())
        remaining = context.time_remaining()
        if remaining is not None:
            limits.append(max(0.0, remaining - 0.05))  # answer before the caller gives up
        view = await self._jobs.wait(
            self._caller(context), request.name, min(limits) if limits else None
        )
        return to_operation(view)


def _legacy_handler(servicer: BatchServicer) -> grpc.GenericRpcHandler:
    """detection.v1.BatchService's methods, each answered by `servicer`'s method of the same
    name with vision.v1's messages (the same fields and numbers: the same bytes)."""
    handlers = {}
    service = bpb.DESCRIPTOR.services_by_name["BatchService"]
    for method in service.methods:
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(LEGACY_BATCH_SERVICE, handlers)


def add_services(server: grpc.aio.Server, jobs: JobService) -> tuple[str, ...]:
    """Adds BatchService (under both its names) and Operations; returns their names for
    reflection and health."""
    bpb_grpc.add_BatchServiceServicer_to_server(BatchServicer(jobs), server)
    server.add_generic_rpc_handlers((_legacy_handler(BatchServicer(jobs, legacy=True)),))
    lro_grpc.add_OperationsServicer_to_server(OperationsServicer(jobs), server)
    return BATCH_SERVICE, LEGACY_BATCH_SERVICE, OPERATIONS_SERVICE
