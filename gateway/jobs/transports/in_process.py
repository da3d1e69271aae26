"""The runner's in-process transport: images straight to the pipeline of the process the
runner is in (the local executor), with no server and no wire in between.

Online requests come first. One Lane per process, shared by every running job, lets a batch
image start only while fewer than `yield_threshold` online images are in flight; otherwise
the image waits, looking again after a short backoff (a threshold of 0 pauses batch work).
Results are the same proto3 JSON the gRPC transport reads off the wire.

A job's images run as its owner (the job's caller): admitted under the owner's quota and fair
share, waiting for that share rather than refused for it (Lane: Pipeline.admits), counted in
the owner's metrics and logged in the payload log under the owner, as the owner's own calls.
"""

from __future__ import annotations

import asyncio
import logging

from gateway import errors
from gateway.api.bindings import Binding
from gateway.api.protojson import to_dict
from gateway.core.cascade import Cascades
from gateway.domain import Outcome, Request
from gateway.errors import GatewayError, Kind
from gateway.jobs.runner.transport import Answer, CallTransport, Deliver, Work, failed
from gateway.jobs.spec import JobSpec

log = logging.getLogger("gateway.jobs")

METHOD = "BatchJob"  # how the metrics and the request log name batch images
_FIRST_LOOK, _LAST_LOOK = 0.005, 0.2  # seconds between looks while online work is in flight
_SHARE_LOOK = 1.0  # at most this long between looks for the owner's share


class Lane:
    """The pipeline as batch work sees it: the same calls, started only when online
    requests leave room."""

    def __init__(self, cascades: Cascades, yield_threshold: int) -> None:
        self._cascades = cascades  # runs a task's images and a pipeline's (Cascades.call)
        self.yield_threshold = yield_threshold
        self.in_flight = 0
        self.waited = 0  # images that had to wait for online work (for tests and logs)

    def _online(self) -> int:
        return self._cascades.pipeline.in_flight - self.in_flight

    async def run(self, task: str, request: Request) -> Outcome:
        await self._share(request.caller)
        pause = _FIRST_LOOK
        if self._online() >= self.yield_threshold:
            self.waited += 1
            while self._online() >= self.yield_threshold:
                await asyncio.sleep(pause)
                pause = min(_LAST_LOOK, pause * 2)
        self.in_flight += 1
        try:
            return await self._cascades.call(task, request)
        finally:
            self.in_flight -= 1

    async def _share(self, owner: str) -> None:
        """Waits while the owner's quota (rate, concurrency) or fair share would refuse it
        (Pipeline.admits, taking nothing), looking again when the refusal says: a job is
        throttled to its owner's share, never refused for it. (A call that loses the race
        for the share after this is OVERLOADED and sent again by the transport.)"""
        while True:
            try:
                return self._cascades.pipeline.admits(owner)
            except GatewayError as e:
                if e.kind is not Kind.OVERLOADED:
                    raise
                await asyncio.sleep(min(e.retry_after or _FIRST_LOOK, _SHARE_LOOK))


def answer(binding: Binding, outcome: Outcome) -> Answer:
    try:
        message = binding.to_result(outcome)
    except Exception:  # a value protobuf refuses: as the doors, INTERNAL with the request id
        log.exception(
            "cannot convert the result", extra={"fields": {"request_id": outcome.request_id}}
        )
        return failed(errors.internal(outcome.request_id))
    result = to_dict(message)
    return Answer(result, f"{outcome.model_name}@{outcome.model_version}", None)


class InProcessTransport(CallTransport):
    def __init__(
        self,
        spec: JobSpec,
        binding: Binding,
        lane: Lane,
        concurrency: int,
        deliver: Deliver,
        owner: str,
        give_up_after: float = 600.0,
    ) -> None:
        super().__init__(
            deliver, concurrency, give_up_after, "the pipeline", "the job resumes from there"
        )
        self.spec = spec
        self.binding = binding
        self._lane = lane
        self._owner = owner

    async def call(self, work: Work) -> Answer:
        outcome = await self._lane.run(self.binding.task, self.request(work.data, work.request_id))
        return answer(self.binding, outcome)

    def request(self, data: bytes, request_id: str) -> Request:
        """The pipeline's request, made as a door makes it from the task's message."""
        message = self.spec.request(self.binding, data, request_id)
        request = self.binding.to_request(message, request_id, METHOD, None, ())
        return request._replace(caller=self._owner)
