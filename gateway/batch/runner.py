"""Sends images to the gateway over many gRPC streams at once and hands back each answer.

`Dispatcher` opens `concurrency / stream_window` streams (DetectStream or ClassifyStream)
spread over a few channels; each stream keeps up to `stream_window` images in flight.
Work comes from one priority queue ordered by the image's position in the job, so images
sent again after a failure go before new ones and the in-order writer is never held up long.

What happens to an image (see also the module docstring of gateway.batch):
- a result: delivered;
- a result whose `error` is set (the gateway's per-image error): delivered as that error,
  except UNAVAILABLE and RESOURCE_EXHAUSTED, which are retried;
- the stream ends with UNAVAILABLE, RESOURCE_EXHAUSTED, CANCELLED, ABORTED or
  DEADLINE_EXCEEDED (also our own watchdog: no answer within `timeout`): the images without
  an answer go back to the queue and the stream is reopened after a jittered backoff;
- the stream ends with FAILED_PRECONDITION, NOT_FOUND, UNIMPLEMENTED, UNAUTHENTICATED or
  PERMISSION_DENIED (wrong model, wrong service, no access): the job stops (FatalError);
- the stream ends with any other code (a gateway that ends the stream at the first bad
  image, as before per-image errors): the oldest image without an answer is sent alone with
  the unary RPC, whose status is that image's own, and the others go back to the queue.
When no answer has come for `give_up_after` seconds while calls keep failing, the job stops
(FatalError) with the last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc

DETECT, CLASSIFY = "detect", "classify"
# Room for the gateway's default 32 MiB image limit plus the rest of the message.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
Code = grpc.StatusCode
RETRYABLE = frozenset(
    {Code.UNAVAILABLE, Code.RESOURCE_EXHAUSTED, Code.CANCELLED, Code.ABORTED,
     Code.DEADLINE_EXCEEDED}
)  # fmt: skip
FATAL = frozenset(
    {Code.FAILED_PRECONDITION, Code.NOT_FOUND, Code.UNIMPLEMENTED, Code.UNAUTHENTICATED,
     Code.PERMISSION_DENIED}
)  # fmt: skip
# Per-image errors in results that are about the gateway's state, not the image: retried.
RETRYABLE_IN_RESULT = frozenset({Code.UNAVAILABLE.value[0], Code.RESOURCE_EXHAUSTED.value[0]})
CODE_NAMES = {c.value[0]: c.name for c in Code}
# An image that times out this many times is given up on (DEADLINE_EXCEEDED as its error).
MAX_TIMEOUTS = 3


class FatalError(Exception):
    """The job cannot go on (gateway down for too long, wrong model, ...); resumable."""


@dataclass(frozen=True)
class Tls:
    enabled: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


@dataclass(frozen=True)
class Options:
    target: str
    task: str = DETECT
    model: str = ""
    version: int | None = None
    label: str | None = None
    min_score: float = 0.0
    max_detections: int = 0
    top_k: int = 0
    concurrency: int = 64
    stream_window: int = 4
    connections: int = 2
    timeout: float = 60.0
    give_up_after: float = 120.0
    tls: Tls = field(default_factory=Tls)

    @property
    def streams(self) -> int:
        return max(1, -(-self.concurrency // self.stream_window))


@dataclass
class Work:
    seq: int  # position in the job: lower goes first
    data: bytes
    request_id: str
    token: Any  # the caller's handle, given back with the answer
    timeouts: int = 0
    sent_at: float = 0.0

    def __lt__(self, other: Work) -> bool:
        return self.seq < other.seq


# (work, result message or None, (code name, message) or None)
Deliver = Callable[[Work, Any, tuple[str, str] | None], None]


class Gateway:
    """Channels, stubs and request messages for the task."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.channels: list[grpc.aio.Channel] = []
        for index in range(max(1, options.connections)):
            channel_options: list[tuple[str, Any]] = [
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # A distinct argument per channel: gRPC would otherwise share one connection
                # between channels with equal arguments (several connections reach several
                # gateway workers or pods).
                ("grpc.batch_runner_connection", index),
            ]
            if options.tls.server_name:
                channel_options.append(("grpc.ssl_target_name_override", options.tls.server_name))
            if options.tls.enabled or options.tls.ca_file or options.tls.cert_file:
                channel = grpc.aio.secure_channel(
                    options.target, options.tls.credentials(), options=channel_options
                )
            else:
                channel = grpc.aio.insecure_channel(options.target, options=channel_options)
            self.channels.append(channel)
        spec = pb.ModelSpec(name=options.model)
        if options.version is not None:
            spec.version = options.version
        elif options.label is not None:
            spec.label = options.label
        self.spec = spec
        if options.task == CLASSIFY:
            stubs = [cpb_grpc.ClassificationServiceStub(c) for c in self.channels]
            self._streams = [s.ClassifyStream for s in stubs]
            self._unary = [s.Classify for s in stubs]
        else:
            dstubs = [pb_grpc.DetectionServiceStub(c) for c in self.channels]
            self._streams = [s.DetectStream for s in dstubs]
            self._unary = [s.Detect for s in dstubs]

    def request(self, work: Work) -> Any:
        o = self.options
        if o.task == CLASSIFY:
            return cpb.ClassifyRequest(
                image=work.data, top_k=o.top_k, min_score=o.min_score, model=self.spec,
                request_id=work.request_id,
            )  # fmt: skip
        return pb.DetectRequest(
            image=work.data, min_score=o.min_score, max_detections=o.max_detections,
            model=self.spec, request_id=work.request_id,
        )  # fmt: skip

    def stream(self, index: int) -> Any:
        return self._streams[index % len(self._streams)]()

    def unary(self, index: int, work: Work) -> Awaitable[Any]:
        call = self._unary[index % len(self._unary)]
        return call(self.request(work), timeout=self.options.timeout)

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


def backoff(failures: int) -> float:
    """Full jitter, 0.1 s doubling to at most 5 s."""
    return random.uniform(0, min(5.0, 0.1 * 2 ** min(failures, 10)))


_CLOSE = Work(seq=1 << 62, data=b"", request_id="", token=None)  # no more work: end the stream


class Dispatcher:
    """Runs the streams; `submit` work, answers go to `deliver` (in the event loop)."""

    def __init__(self, options: Options, deliver: Deliver) -> None:
        self.options = options
        self.gateway = Gateway(options)
        self._deliver = deliver
        self._queue: asyncio.PriorityQueue[Work] = asyncio.PriorityQueue()
        self._fatal: str | None = None
        self._failing_since: float | None = None
        self._last_error = ""
        self.retries = 0
        self._workers: list[asyncio.Task[None]] = []
        self._monitor_task: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()  # set on a fatal error
        # Set once all new work is submitted: streams then half-close whenever the queue is
        # empty. A gateway may hold finished results until its window fills or the request
        # stream ends (the DetectStream before per-image errors does), so the last images of
        # a job would otherwise wait for the watchdog.
        self._draining = asyncio.Event()

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._worker(n)) for n in range(self.options.streams)]
        self._monitor_task = asyncio.create_task(self._monitor())

    def submit(self, work: Work) -> None:
        self._queue.put_nowait(work)

    def drain(self) -> None:
        """No new work will be submitted (retries may still come)."""
        self._draining.set()

    async def _next(self) -> Work | None:
        """The next work, or None when draining and there is none."""
        while True:
            if not self._queue.empty():
                return self._queue.get_nowait()
            if self._draining.is_set():
                return None
            getter = asyncio.ensure_future(self._queue.get())
            drained = asyncio.ensure_future(self._draining.wait())
            try:
                await asyncio.wait({getter, drained}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                drained.cancel()
                if not getter.done():
                    getter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await getter
            if getter.done() and not getter.cancelled():
                return getter.result()

    def _requeue(self, works: list[Work]) -> None:
        self.retries += len(works)
        for work in works:
            self._queue.put_nowait(work)

    async def close(self) -> None:
        """Ends the streams once everything submitted has been delivered."""
        for _ in self._workers:
            self._queue.put_nowait(_CLOSE)
        await asyncio.gather(*self._workers)
        await self.abort()

    async def abort(self) -> None:
        for task in [*self._workers, self._monitor_task]:
            if task is not None and not task.done():
                task.cancel()
        for task in [*self._workers, self._monitor_task]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.gateway.close()

    def check(self) -> None:
        """Raises FatalError when the job has to stop."""
        if self._fatal is not None:
            raise FatalError(self._fatal)

    def _fail(self, message: str) -> None:
        if self._fatal is None:
            self._fatal = message
            self.stopped.set()

    def _answered(self) -> None:
        self._failing_since = None

    def _failed(self, what: str) -> None:
        self._last_error = what
        if self._failing_since is None:
            self._failing_since = time.monotonic()

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            since = self._failing_since
            if since is not None and time.monotonic() - since > self.options.give_up_after:
                self._fail(
                    f"no answer from the gateway at {self.options.target} for "
                    f"{self.options.give_up_after:g} s while calls kept failing (last: "
                    f"{self._last_error}); everything answered so far is saved: run the same "
                    "command again to resume"
                )
                return

    async def _worker(self, index: int) -> None:
        failures = 0
        while self._fatal is None:
            first = await self._queue.get()
            if first is _CLOSE:
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
        call = self.gateway.stream(index)
        inflight: deque[Work] = deque()
        window = asyncio.Semaphore(self.options.stream_window)
        last_answer = time.monotonic()
        timed_out = False
        closed = False

        async def send() -> None:
            nonlocal closed
            work: Work | None = first
            try:
                while True:
                    await window.acquire()
                    if work is None:
                        work = await self._next()
                    if work is None:
                        await call.done_writing()  # drained: let the gateway flush
                        return
                    if work is _CLOSE:
                        closed = True
                        await call.done_writing()
                        return
                    work.sent_at = time.monotonic()
                    inflight.append(work)
                    await call.write(self.gateway.request(work))
                    work = None
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                return  # the call has ended: the reader sees its status

        async def watchdog() -> None:
            nonlocal timed_out
            while True:
                await asyncio.sleep(min(1.0, self.options.timeout / 4))
                if inflight:
                    waited = time.monotonic() - max(inflight[0].sent_at, last_answer)
                    if waited > self.options.timeout:
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
                self._answered()
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
            self._queue.put_nowait(_CLOSE)  # this stream took the close: pass it on
            closed = False
        if timed_out:
            head = unanswered[0]
            head.timeouts += 1
            self._failed(f"DEADLINE_EXCEEDED: no answer within {self.options.timeout:g} s")
            if head.timeouts >= MAX_TIMEOUTS:
                unanswered.pop(0)
                message = f"no answer within {self.options.timeout:g} s, {MAX_TIMEOUTS} times"
                self._deliver(head, None, ("DEADLINE_EXCEEDED", message))
            self._requeue(unanswered)
            return "retry"
        if error is None:
            self._requeue(unanswered)  # ended without a status: send them again
            if closed and not unanswered:
                return "closed"
            return "retry" if unanswered else "ok"
        code = error.code()
        details = error.details() or ""
        if code in FATAL:
            self._requeue(unanswered)
            self._fail(f"the gateway refused the job: {code.name}: {details}")
            return "retry"
        if code in RETRYABLE:
            self._failed(f"{code.name}: {details}")
            self._requeue(unanswered)
            return "retry"
        # The stream was ended by one image (a gateway without per-image errors): find out
        # which one with the unary RPC, send the rest again.
        if unanswered:
            self._requeue(unanswered[1:])
            await self._probe(index, unanswered[0])
        return "ok"

    async def _probe(self, index: int, work: Work) -> None:
        try:
            response = await self.gateway.unary(index, work)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code in FATAL:
                self._requeue([work])
                self._fail(f"the gateway refused the job: {code.name}: {e.details()}")
            elif code in RETRYABLE:
                self._failed(f"{code.name}: {e.details()}")
                self._requeue([work])
            else:
                self._answered()
                self._deliver(work, None, (code.name, e.details() or ""))
            return
        self._answered()
        self._handle(work, response)

    def _handle(self, work: Work, response: Any) -> None:
        if response.HasField("error") and response.error.code != 0:
            code = response.error.code
            if code in RETRYABLE_IN_RESULT:
                self._failed(f"{CODE_NAMES.get(code, code)}: {response.error.message}")
                self._requeue([work])
                return
            self._deliver(work, None, (CODE_NAMES.get(code, str(code)), response.error.message))
            return
        self._deliver(work, response, None)
