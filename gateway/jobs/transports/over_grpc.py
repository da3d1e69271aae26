"""The runner's gRPC transport: images to a gateway over many streams at once.

`concurrency / stream_window` streams (DetectStream or ClassifyStream) spread over a few
channels; each keeps up to `stream_window` images in flight. Work comes from one priority
queue ordered by the image's position in the job, so images sent again after a failure go
before new ones and the in-order writer is never held up long.

A status ends a stream for all its images; its kind (the contract's code <-> kind table,
gateway.api.status) decides what happens to them (gateway.jobs.runner.transport): RETRY kinds go
back to the queue, stopping kinds stop the job, and a per-image kind (a gateway that ends the
stream at the first bad image) is found out by sending the oldest unanswered image alone
with the unary RPC, whose status is that image's own. Our own watchdog (no answer within `timeout`)
counts as DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import grpc

from gateway.api import status
from gateway.api.bindings import Binding
from gateway.api.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    AioTaskStub,
    open_aio_channel,
    open_channel,
    task_methods,
)
from gateway.api.protojson import to_dict
from gateway.errors import GatewayError, Kind
from gateway.identity import JOB_OWNER
from gateway.jobs.runner.transport import (
    CLOSE,
    RETRY,
    Answer,
    Deliver,
    Queue,
    Work,
    backoff,
    failed,
)
from gateway.jobs.spec import JobSpec
from gateway.tls import TLS

Code = grpc.StatusCode
_NUMBERS = {c.value[0]: c for c in Code}


def kind_of(code: grpc.StatusCode) -> Kind:
    """The kind of a status a gateway (or a proxy before it) answered with: the contract's
    table (gateway.api.status)."""
    return status.kind_of(code.value[0])


# How gRPC reports a connection the server closed as it opened: what a TLS mismatch looks
# like from the client (with TLS 1.3 a refused client certificate is only seen as a close).
_CLOSED = ("Socket closed", "Connection reset", "handshake", "SSL_ERROR")


def connection_hint(message: str, tls: TLS | None) -> str:
    """What to check when the gateway closes connections as they open (else "")."""
    if not any(sign in message for sign in _CLOSED):
        return ""
    if tls is None:
        return "; the gateway closed the connection: if it serves TLS, pass --tls or --ca-file"
    if not tls.cert_file:
        return (
            "; the gateway closed the TLS connection: if it requires client certificates "
            "(mTLS), pass --cert-file and --key-file"
        )
    return (
        "; the gateway closed the TLS connection: check that --cert-file is signed by the CA "
        "the gateway trusts for clients (GATEWAY_TLS_CLIENT_CA_FILE) and has not expired"
    )


@dataclass(frozen=True)
class Knobs:
    """How to reach the gateway; may change between runs of the same job."""

    target: str
    concurrency: int = 64
    stream_window: int = 4
    connections: int = 2
    timeout: float = 60.0
    give_up_after: float = 120.0
    tls: TLS | None = None
    owner: str = ""  # the job's owner, named on every call (gateway.identity.JOB_OWNER)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return ((JOB_OWNER, self.owner),) if self.owner else None

    @property
    def streams(self) -> int:
        return max(1, -(-self.concurrency // self.stream_window))


class Calls:
    """Channels, stubs and request messages for the job's task."""

    def __init__(self, spec: JobSpec, binding: Binding, knobs: Knobs) -> None:
        self.knobs = knobs
        self.binding = binding
        self.channels = [
            open_aio_channel(knobs.target, knobs.tls, DEFAULT_MAX_MESSAGE_BYTES, connection=n)
            for n in range(max(1, knobs.connections))
        ]
        self.stubs = [AioTaskStub(channel, binding) for channel in self.channels]
        self.spec = spec

    def request(self, work: Work) -> Any:
        return self.spec.request(self.binding, work.data, work.request_id)

    def stream(self, index: int) -> Any:
        return self.stubs[index % len(self.stubs)].stream(metadata=self.knobs.metadata)

    def unary(self, index: int, work: Work) -> Awaitable[Any]:
        stub = self.stubs[index % len(self.stubs)]
        return stub.unary(
            self.request(work), timeout=self.knobs.timeout, metadata=self.knobs.metadata
        )

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


# The request id of the call check_options makes (so that the gateway's log tells it apart).
CHECK_REQUEST_ID = "detection-batch-options-check"


def check_options(spec: JobSpec, binding: Binding, knobs: Knobs) -> None:
    """Has the gateway's task judge the job's options against the model before any image is
    read: one unary call without an image, whose refusal of an option (INVALID_ARGUMENT for
    anything but the missing image) is a GatewayError INVALID_INPUT. Any other answer is left
    to the run (an unreachable gateway is retried there). A blocking channel: an asyncio one
    made in an event loop of its own before the run's left the run's calls hanging (grpc.aio
    keeps to the first loop it meets)."""
    binding.check_options(spec.options)
    request = spec.request(binding, request_id=CHECK_REQUEST_ID)
    with open_channel(knobs.target, knobs.tls, DEFAULT_MAX_MESSAGE_BYTES) as channel:
        unary, _ = task_methods(channel, binding)
        try:
            unary(request, timeout=knobs.timeout, metadata=knobs.metadata)
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
            if code == Code.INVALID_ARGUMENT and not details.startswith("image is empty"):
                raise GatewayError(
                    Kind.INVALID_INPUT, f"the gateway refused the options: {details}"
                ) from None


def answer(response: Any, binding: Binding) -> Answer:
    """A result message as the runner keeps it, or its per-image error."""
    if response.HasField("error") and response.error.code != 0:
        code = _NUMBERS.get(response.error.code, Code.UNKNOWN)
        return failed(GatewayError(kind_of(code), response.error.message))
    result = to_dict(response)
    served = binding.served(response)
    return Answer(result, f"{served.name}@{served.version}", None)


class GrpcTransport(Queue):
    def __init__(self, spec: JobSpec, binding: Binding, knobs: Knobs, deliver: Deliver) -> None:
        super().__init__(
            deliver,
            knobs.give_up_after,
            f"the gateway at {knobs.target}",
            "run the same command again to resume",
        )
        self.knobs = knobs
        self.calls = Calls(spec, binding, knobs)

    def workers(self) -> int:
        return self.knobs.streams

    def failing(self, error: GatewayError) -> None:
        hint = connection_hint(error.message, self.knobs.tls)
        super().failing(GatewayError(error.kind, error.message + hint) if hint else error)

    async def finish(self) -> None:
        await self.calls.close()

    async def worker(self, index: int) -> None:
        failures = 0
        while not self.stopping:
            first = await self.get()
            if first is CLOSE:
                return
            outcome = await self._run_stream(index, first)
            if outcome == "closed":
                return
            if outcome == "ok":
                failures = 0
            else:
                failures += 1
                await asyncio.sleep(backoff(failures))

    async def _run_stream(self, index: int, first: Work) -> str:
        """One stream until it ends: "ok", "closed" (no more work) or "retry"."""
        call = self.calls.stream(index)
        inflight: deque[Work] = deque()
        window = asyncio.Semaphore(self.knobs.stream_window)
        last_answer = time.monotonic()
        timed_out = False
        closed = False

        # `first` is the stream's from now on: unanswered (so sent again) if the stream ends
        # before the sender has even written it.
        first.sent_at = time.monotonic()
        inflight.append(first)

        async def send() -> None:
            nonlocal closed
            try:
                await window.acquire()
                await call.write(self.calls.request(first))
                while True:
                    await window.acquire()
                    work = await self.next()
                    if work is None:
                        await call.done_writing()  # drained: let the gateway flush
                        return
                    if work is CLOSE:
                        closed = True
                        await call.done_writing()
                        return
                    work.sent_at = time.monotonic()
                    inflight.append(work)
                    await call.write(self.calls.request(work))
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                return  # the call has ended: the reader sees its status

        async def watchdog() -> None:
            nonlocal timed_out
            while True:
                await asyncio.sleep(min(1.0, self.knobs.timeout / 4))
                if inflight:
                    waited = time.monotonic() - max(inflight[0].sent_at, last_answer)
                    if waited > self.knobs.timeout:
                        timed_out = True
                        call.cancel()
                        return

        sender = asyncio.create_task(send())
        guard = asyncio.create_task(watchdog())
        error: grpc.aio.AioRpcError | None = None
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    break
                last_answer = time.monotonic()
                work = inflight.popleft()
                window.release()
                self._handle(work, response)
        except grpc.aio.AioRpcError as e:
            error = e
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not timed_out or (current is not None and current.cancelling()):
                call.cancel()
                raise
        finally:
            for task in (sender, guard):
                task.cancel()
            for task in (sender, guard):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        unanswered = list(inflight)
        if closed and (timed_out or error is not None or unanswered):
            self.pass_close()  # this stream took the close: pass it on
            closed = False
        if timed_out:
            if self.timed_out(unanswered[0], f"no answer within {self.knobs.timeout:g} s"):
                unanswered.pop(0)
            self.requeue(unanswered)
            return "retry"
        if error is None:
            self.requeue(unanswered)  # ended without a status: send them again
            if closed and not unanswered:
                return "closed"
            return "retry" if unanswered else "ok"
        kind = kind_of(error.code())
        failure = GatewayError(kind, error.details() or "")
        if kind in RETRY:
            self.failing(failure)
            self.requeue(unanswered)
            return "retry"
        if not kind.per_item:
            self.requeue(unanswered)
            self.stop(kind, f"the gateway refused the job: {error.code().name}: {failure.message}")
            return "retry"
        # The stream was ended by one image (a gateway without per-image errors): find out
        # which one with the unary RPC, send the rest again.
        if unanswered:
            self.requeue(unanswered[1:])
            await self._probe(index, unanswered[0])
        return "ok"

    async def _probe(self, index: int, work: Work) -> None:
        try:
            response = await self.calls.unary(index, work)
        except grpc.aio.AioRpcError as e:
            kind = kind_of(e.code())
            failure = GatewayError(kind, e.details() or "")
            if kind in RETRY:
                self.failing(failure)
                self.requeue([work])
            elif not kind.per_item:
                self.requeue([work])
                self.stop(kind, f"the gateway refused the job: {e.code().name}: {failure.message}")
            else:
                self.deliver(work, failed(failure))
            return
        self._handle(work, response)

    def _handle(self, work: Work, response: Any) -> None:
        self.answered()  # an answer, even a per-image "retry later": the gateway is there
        found = answer(response, self.calls.binding)
        if found.error is not None and found.error.kind in RETRY:
            self.failing(found.error)
            self.requeue([work])
            return
        self.deliver(work, found)
