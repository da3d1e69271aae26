"""How the runner reaches the gateway's pipeline: a Transport takes images and hands back, for
each, its result or its error (as an errors.Kind).

Two transports share the queue and the failure rules here: gRPC streams to a gateway
(gateway.jobs.transports.over_grpc: `detection-batch` and the Kubernetes executor's pods) and direct
calls to the pipeline of the process the runner is in (gateway.jobs.transports.in_process: the local
executor).

What happens to an image depends on the kind of its failure, the same for both transports:
- per-image kinds (`Kind.per_item`: a bad or too large image, ...): that line's error;
- RETRY kinds (the gateway or TF Serving is full, unreachable, slow, stopping): the image
  goes back to the queue, before newer images, after a jittered backoff; an image that
  times out MAX_TIMEOUTS times becomes that line's DEADLINE_EXCEEDED;
- any other kind (no such model, a model that cannot do the task, no access): the job
  stops (StopJob, resumable).
When no answer has come for `give_up_after` seconds while calls keep failing, the job stops
with the last failure's kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from gateway.errors import GatewayError, Kind

RETRY = frozenset({Kind.OVERLOADED, Kind.UNAVAILABLE, Kind.DEADLINE, Kind.CANCELLED, Kind.ABORTED})
# An image that times out this many times is given up on (DEADLINE_EXCEEDED as its error).
MAX_TIMEOUTS = 3


class StopJob(Exception):
    """The job cannot go on (no such model, no access, the gateway down for too long);
    everything answered is kept, so running it again resumes."""

    def __init__(self, kind: Kind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


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


class Answer(NamedTuple):
    """One image's answer: the result as proto3 JSON (the .proto field names, every field
    present) and the model@version that served it, or the error."""

    result: dict[str, Any] | None
    model: str | None
    error: GatewayError | None


Deliver = Callable[[Work, Answer], None]


class Transport(Protocol):
    retries: int  # images sent again
    stopped: asyncio.Event  # set when the job has to stop (check() raises)

    def start(self) -> None: ...

    def submit(self, work: Work) -> None: ...

    def drain(self) -> None:
        """No new work will be submitted (retries may still come)."""

    async def close(self) -> None:
        """Returns once everything submitted has been answered."""

    async def abort(self) -> None:
        """Stops at once, answered or not."""

    def check(self) -> None:
        """Raises StopJob when the job has to stop."""


def failed(error: GatewayError) -> Answer:
    return Answer(None, None, error)


def backoff(failures: int) -> float:
    """Full jitter, 0.1 s doubling to at most 5 s."""
    return random.uniform(0, min(5.0, 0.1 * 2 ** min(failures, 10)))


# No more work: a worker that takes it ends (it is passed on when taken too early).
CLOSE = Work(seq=1 << 62, data=b"", request_id="", token=None)


class Queue:
    """The work queue, the give-up watchdog and the stop signal both transports share."""

    def __init__(self, deliver: Deliver, give_up_after: float, describe: str, resume: str) -> None:
        self._deliver = deliver
        self._give_up_after = give_up_after
        self._describe = describe  # where the images go, for messages
        self._resume = resume  # how the job resumes, for messages
        self._queue: asyncio.PriorityQueue[Work] = asyncio.PriorityQueue()
        self._stop: StopJob | None = None
        self._failing_since: float | None = None
        self._last_error: GatewayError | None = None
        self.retries = 0
        self.stopped = asyncio.Event()
        self._draining = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._monitor_task: asyncio.Task[None] | None = None

    def workers(self) -> int:
        raise NotImplementedError

    async def worker(self, index: int) -> None:
        raise NotImplementedError

    async def finish(self) -> None:
        """What a transport releases once its workers are gone (channels, ...)."""

    def start(self) -> None:
        self._workers = [asyncio.create_task(self.worker(n)) for n in range(self.workers())]
        self._monitor_task = asyncio.create_task(self._monitor())

    def submit(self, work: Work) -> None:
        self._queue.put_nowait(work)

    def drain(self) -> None:
        self._draining.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def get_nowait(self) -> Work:
        return self._queue.get_nowait()

    async def get(self) -> Work:
        return await self._queue.get()

    async def next(self) -> Work | None:
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
            except BaseException:
                # Cancelled (the stream ended) just as the getter took an image off the
                # queue: the image goes back, or no worker would ever send it.
                if getter.done() and not getter.cancelled():
                    self._queue.put_nowait(getter.result())
                raise
            finally:
                drained.cancel()
                if not getter.done():
                    getter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await getter
            if getter.done() and not getter.cancelled():
                return getter.result()

    def requeue(self, works: list[Work]) -> None:
        self.retries += len(works)
        for work in works:
            self._queue.put_nowait(work)

    def pass_close(self) -> None:
        self._queue.put_nowait(CLOSE)

    async def close(self) -> None:
        for _ in self._workers:
            self._queue.put_nowait(CLOSE)
        await asyncio.gather(*self._workers)
        await self.abort()

    async def abort(self) -> None:
        tasks = [t for t in (*self._workers, self._monitor_task) if t is not None]
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.finish()

    def check(self) -> None:
        if self._stop is not None:
            raise self._stop

    @property
    def stopping(self) -> bool:
        return self._stop is not None

    def stop(self, kind: Kind, message: str) -> None:
        if self._stop is None:
            self._stop = StopJob(kind, message)
            self.stopped.set()

    def deliver(self, work: Work, answer: Answer) -> None:
        self._failing_since = None
        self._deliver(work, answer)

    def answered(self) -> None:
        self._failing_since = None

    def failing(self, error: GatewayError) -> None:
        """A call failed in a way that is retried; the job stops when it goes on too long."""
        self._last_error = error
        if self._failing_since is None:
            self._failing_since = time.monotonic()

    def timed_out(self, work: Work, message: str) -> bool:
        """Counts a timeout of `work` ("no answer within ..."); True when it was the last one
        allowed: the image is then delivered as DEADLINE_EXCEEDED."""
        work.timeouts += 1
        self.failing(GatewayError(Kind.DEADLINE, message))
        if work.timeouts < MAX_TIMEOUTS:
            return False
        self._deliver(work, failed(GatewayError(Kind.DEADLINE, f"{message}, {MAX_TIMEOUTS} times")))
        return True

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            since = self._failing_since
            if since is not None and time.monotonic() - since > self._give_up_after:
                last = self._last_error
                kind = last.kind if last is not None else Kind.UNAVAILABLE
                shown = f"{last.code}: {last.message}" if last is not None else "none"
                self.stop(
                    kind,
                    f"no answer from {self._describe} for {self._give_up_after:g} s while calls "
                    f"kept failing (last: {shown}); everything answered so far is saved: "
                    f"{self._resume}",
                )
                return


class CallTransport(Queue):
    """A transport whose workers each send one image at a time and wait for its answer:
    `call` returns the answer, or raises GatewayError when the call itself failed (the
    failure rules above decide what happens to the image)."""

    def __init__(
        self, deliver: Deliver, concurrency: int, give_up_after: float, describe: str, resume: str
    ) -> None:
        super().__init__(deliver, give_up_after, describe, resume)
        self._concurrency = concurrency

    def workers(self) -> int:
        return max(1, self._concurrency)

    async def call(self, work: Work) -> Answer:
        raise NotImplementedError

    async def worker(self, index: int) -> None:
        failures = 0
        while not self.stopping:
            work = await self.next()
            if work is None or work is CLOSE:
                return
            try:
                found = await self.call(work)
            except GatewayError as e:
                if e.kind.per_item:
                    self.deliver(work, failed(e))
                    failures = 0
                elif e.kind in RETRY:
                    if e.kind is Kind.DEADLINE and self.timed_out(work, e.message):
                        continue
                    self.failing(e)
                    self.requeue([work])
                    failures += 1
                    await asyncio.sleep(backoff(failures))
                else:
                    self.requeue([work])
                    self.stop(e.kind, e.message)
                continue
            self.deliver(work, found)
            failures = 0
