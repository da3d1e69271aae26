"""The tasks' gRPC services, one per binding (gateway.api.bindings): convert, delegate to the
pipeline, answer.

No pipeline logic here, and no task: each service is its binding's RPCs over the same code.
Unary calls return the result or abort with the status of the pipeline's error
(gateway.frontends.grpc.status). Streams keep a window of images in flight,
answer in request order, put a per-image error (google.rpc.Status) in the result of an image
that failed on its own and go on, and end with the status of an error that concerns the whole
stream. Every call carries `x-request-id` back in its trailing metadata. Once the gateway
drains (SIGTERM), new calls are refused with UNAVAILABLE (Drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol, TypeVar

import grpc
from google.rpc import status_pb2

from gateway import errors, identity, logs, metrics
from gateway.api import strings
from gateway.api.bindings import TRACE_HEADERS, Binding, ToRequest
from gateway.config import Settings
from gateway.core.pipeline import Pipeline, new_request_id
from gateway.domain import Outcome, Request, Trace
from gateway.errors import GatewayError
from gateway.frontends.grpc.status import STATUS, abort

log = logging.getLogger("gateway.pipeline")
request_log = logs.RequestLog()

DRAINING = "the gateway is shutting down and takes no new requests; retry (another replica answers)"


class Drain:
    """Counts the API calls in flight; once draining, the servicers refuse new ones with
    UNAVAILABLE.

    SIGTERM drains here, with the server still running, instead of in gRPC's own
    `server.stop(grace)`: a call that reaches gRPC in the instant its server starts to shut
    down is sometimes neither refused nor served until the server is gone (seen with a plain
    grpc.aio server too, about 1 health check in 100 sent at that instant), so a health probe
    could hang for the whole grace period. Draining first, health checks keep answering
    (NOT_SERVING) and the server stops only when nothing is left in flight, after which the
    process exits at once. (Counted in the servicers rather than by a server interceptor,
    which would cost every call an extra round of Python.)
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        self._idle: asyncio.Event | None = None  # made when draining starts

    def enter(self) -> bool:
        """Counts a new call in; False when draining (the call must be refused)."""
        if self.draining:
            return False
        self.in_flight += 1
        if self._idle is not None:
            self._idle.clear()
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def drain(self, timeout: float) -> int:
        """Refuses new API calls and waits up to `timeout` for the ones in flight; returns
        how many are still in flight (the server's stop cancels those)."""
        self.draining = True
        if self._idle is None:
            self._idle = asyncio.Event()
            if self.in_flight == 0:
                self._idle.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self.in_flight


RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


def _converted(to_result: Callable[[Outcome], ResultT], outcome: Outcome) -> ResultT:
    """The result message; a value protobuf refuses (a bug, or a model output no check
    caught) is INTERNAL with the request id, like any other unexpected failure."""
    try:
        return to_result(outcome)
    except Exception:
        log.exception(
            "cannot convert the result", extra={"fields": {"request_id": outcome.request_id}}
        )
        raise errors.internal(outcome.request_id) from None


def _metadata(context: grpc.aio.ServicerContext, settings: Settings) -> tuple[str, Trace, str]:
    """The caller's x-request-id (or ""), the trace headers to pass on, and who is calling
    (gateway.identity); GatewayError when a header breaks its rule (gateway.api.strings) or
    the identity cannot be taken."""
    request_id = ""
    trace = []
    for key, value in context.invocation_metadata() or ():
        if key in TRACE_HEADERS and isinstance(value, str):
            trace.append((key, value))
            if key == "x-request-id":
                request_id = value
    strings.trace(trace)
    return request_id, tuple(trace), _caller(context, settings)


def _caller(context: grpc.aio.ServicerContext, settings: Settings) -> str:
    """The call's identity (gateway.identity), or the job owner a batch runner names."""
    caller = identity.of_grpc(context, settings.trust_xfcc)
    owner = next(
        (v for k, v in context.invocation_metadata() or () if k == identity.JOB_OWNER), None
    )
    runners = identity.runner_identities(settings.batch_runner_identities)
    return identity.on_behalf(caller, owner if isinstance(owner, str) else None, runners)


def _check(request: Any) -> None:
    """The request message's own strings (every binding's request has request_id and model)."""
    model = request.model
    strings.request(request.request_id, model.name, model.label)


async def _failed(error: GatewayError) -> Outcome:
    raise error


async def _refuse(
    context: grpc.aio.ServicerContext, method: str, error: GatewayError, started: float
) -> None:
    """Ends a call refused before any work, under a request id of the gateway's (the
    caller's may be what was refused), counted and logged like the pipeline's answers."""
    request_id = new_request_id()
    total = time.perf_counter() - started
    metrics.record(method, error.code, total, 0.0, 0.0)
    if request_log.enabled():
        latency = {"total": round(total * 1000, 2)}
        fields = {"method": method, "code": error.code, "request_id": request_id}
        request_log.write({**fields, "latency_ms": latency})
    context.set_trailing_metadata((("x-request-id", request_id),))
    await abort(context, error, (("x-request-id", request_id),))


class Runner(Protocol):
    """What a service runs its calls on: the pipeline (a task on one image), or the cascades
    (gateway.core.cascade: a pipeline of models, named by the request's model)."""

    @property
    def settings(self) -> Settings: ...

    async def run(self, name: str, request: Request) -> Outcome: ...


async def serve_unary(
    pipeline: Runner,
    drain: Drain,
    task: str,
    method: str,
    request: RequestT,
    context: grpc.aio.ServicerContext,
    to_request: ToRequest,
    to_result: Callable[[Outcome], ResultT],
    check: Callable[[Any], None] = _check,
) -> ResultT:
    if not drain.enter():
        await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
    try:
        try:
            header_id, trace, caller = _metadata(context, pipeline.settings)
            check(request)
        except GatewayError as exc:
            await _refuse(context, method, exc, time.perf_counter())
            raise  # unreachable: abort raises
        request_id = getattr(request, "request_id", "") or header_id or new_request_id()
        context.set_trailing_metadata((("x-request-id", request_id),))
        try:
            timeout = context.time_remaining()
            domain = to_request(request, request_id, method, timeout, trace)
            outcome = await pipeline.run(task, domain._replace(caller=caller))
            return _converted(to_result, outcome)
        except GatewayError as exc:
            await abort(context, exc, (("x-request-id", request_id),))
            raise  # unreachable: abort raises
    finally:
        drain.leave()


async def serve_stream(
    pipeline: Runner,
    drain: Drain,
    task: str,
    method: str,
    requests: AsyncIterator[RequestT],
    context: grpc.aio.ServicerContext,
    to_request: ToRequest,
    to_result: Callable[[Outcome], ResultT],
    error_result: Callable[[GatewayError, str], ResultT],
    check: Callable[[Any], None] = _check,
) -> AsyncIterator[ResultT]:
    """Reads frames in one task and answers them in order as each result is ready.

    Back-pressure: at most `stream_window` frames are read ahead of the last result handed
    to gRPC (which waits on the client's flow control), so a slow reader slows the sender.
    A client that waits for each answer before sending the next frame gets it at once.
    """
    try:
        header_id, trace, caller = _metadata(context, pipeline.settings)
    except GatewayError as exc:
        await _refuse(context, method, exc, time.perf_counter())
        raise  # unreachable: abort raises
    stream_id = header_id or new_request_id()
    context.set_trailing_metadata((("x-request-id", stream_id),))
    window = asyncio.Semaphore(pipeline.settings.stream_window)
    # (request id, its work) in request order; None once the client has sent everything.
    pending: asyncio.Queue[tuple[str, asyncio.Task[Outcome]] | None] = asyncio.Queue()
    in_flight: set[asyncio.Task[Outcome]] = set()

    async def read() -> None:
        index = 0
        async for request in requests:
            await window.acquire()
            frame_id = f"{stream_id}-{index}"
            index += 1
            try:
                check(request)
            except GatewayError as exc:  # this frame's own: its result says so, under frame_id
                started = asyncio.ensure_future(_failed(exc))
                in_flight.add(started)
                pending.put_nowait((frame_id, started))
                continue
            request_id = getattr(request, "request_id", "") or frame_id
            timeout = context.time_remaining()
            domain = to_request(request, request_id, method, timeout, trace)
            work = pipeline.run(task, domain._replace(caller=caller))
            started = asyncio.ensure_future(work)
            in_flight.add(started)
            pending.put_nowait((request_id, started))
        pending.put_nowait(None)

    async def answer(request_id: str, work: asyncio.Task[Outcome]) -> ResultT:
        try:
            return _converted(to_result, await work)
        except GatewayError as exc:
            if exc.kind.per_item:
                return error_result(exc, request_id)
            raise
        finally:
            in_flight.discard(work)

    if not drain.enter():
        await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
    reader = asyncio.ensure_future(read())
    try:
        while True:
            if reader.done():
                reader.result()  # the client's stream broke: its error ends this one
                item = await pending.get()
            else:
                # Wait for the next frame's work, or for the reader to fail or finish.
                next_get = asyncio.ensure_future(pending.get())
                await asyncio.wait((next_get, reader), return_when=asyncio.FIRST_COMPLETED)
                if not next_get.done():
                    next_get.cancel()  # nothing was taken from the queue
                    continue
                item = next_get.result()
            if item is None:
                break
            yield await answer(*item)
            # gRPC asks for the next result once it has taken this one: read one more frame.
            window.release()
    except GatewayError as exc:
        await abort(context, exc, (("x-request-id", stream_id),))
    finally:
        reader.cancel()
        for work in in_flight:
            work.cancel()
        drain.leave()


class TaskServicer:
    """One task's service (its binding's unary and streaming RPCs) over the pipeline."""

    def __init__(self, binding: Binding, pipeline: Pipeline, drain: Drain) -> None:
        self._binding = binding
        self._pipeline = pipeline
        self._drain = drain
        self._result_type = binding.result_type

    async def unary(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        binding = self._binding
        return await serve_unary(
            self._pipeline,
            self._drain,
            binding.task,
            binding.unary,
            request,
            context,
            binding.to_request,
            binding.to_result,
        )

    async def stream(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        binding = self._binding
        async for result in serve_stream(
            self._pipeline,
            self._drain,
            binding.task,
            binding.stream,
            request_iterator,
            context,
            binding.to_request,
            binding.to_result,
            self._error_result,
        ):
            yield result

    def _error_result(self, error: GatewayError, request_id: str) -> Any:
        return self._result_type(request_id=request_id, error=to_status(error))


def add_task_services(
    server: grpc.aio.Server, bindings: Iterable[Binding], pipeline: Pipeline, drain: Drain
) -> tuple[str, ...]:
    """Adds every binding's service to `server`; returns the services' full names."""
    names = []
    for binding in bindings:
        servicer = TaskServicer(binding, pipeline, drain)
        parse, serialize = binding.request_type.FromString, binding.result_type.SerializeToString
        handlers = {
            binding.unary: grpc.unary_unary_rpc_method_handler(
                servicer.unary, request_deserializer=parse, response_serializer=serialize
            ),
            binding.stream: grpc.stream_stream_rpc_method_handler(
                servicer.stream, request_deserializer=parse, response_serializer=serialize
            ),
        }
        name = binding.service_name
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        # As generated code does: gRPC then matches these methods without the generic lookup.
        server.add_registered_method_handlers(name, handlers)
        names.append(name)
    return tuple(names)


def to_status(error: GatewayError) -> status_pb2.Status:
    """A per-image error for a stream result (google.rpc.Status; codes as gRPC's)."""
    return status_pb2.Status(code=STATUS[error.kind].value[0], message=error.message)
