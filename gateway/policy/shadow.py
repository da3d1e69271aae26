"""Shadow calls: a copy of an answered request sent to a rollout's shadow candidate in the
background, its answer compared with the caller's by the task (Task.compare), never the other
way round: the caller's answer is out before the copy starts, and nothing the copy does
reaches the caller. The comparison runs in a thread of its own (one: comparisons wait their
turn there rather than take the decode threads or the event loop), bounded by the answers'
sizes, which the model's limits bound (a thousand boxes a side: milliseconds).

Bounded: at most MAX_PENDING copies at a time in a process. A copy is dropped (and counted)
when that many are pending, or when the gateway's requests in flight are within a quarter of
--max-concurrent-requests: shadow traffic is the first thing to go under load. Copies take no
concurrency ticket and no caller's fair share (gateway.policy.fairshare), and have what was
left of the caller's deadline when its answer went out (gateway.core.pipeline).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.domain import Comparison, Outcome
from gateway.errors import GatewayError
from gateway.policy.rollout import ModelRollout

Compare = Callable[[Any, Any], Comparison]
Call = Callable[[], Awaitable[Outcome]]  # the request again, on the shadow candidate

log = logging.getLogger("gateway.shadow")

# Copies pending at once per process: enough for a share of a busy model's traffic on the
# calls TF Serving answers in tens of milliseconds, small enough that a stuck candidate holds
# little memory (a copy keeps its image until the candidate answers or times out).
MAX_PENDING = 8


class Shadows:
    def __init__(
        self, limit: int, in_flight: Callable[[], int], max_pending: int = MAX_PENDING
    ) -> None:
        # Requests in flight from which copies are dropped: three quarters of the limit.
        self._near_limit = max(1, limit - limit // 4)
        self._in_flight = in_flight
        self.max_pending = max_pending
        self._pending: set[asyncio.Task[None]] = set()
        self._compare_thread: ThreadPoolExecutor | None = None  # made on first use

    def close(self) -> None:
        if self._compare_thread is not None:
            self._compare_thread.shutdown(wait=False, cancel_futures=True)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def send(self, rollout: ModelRollout, current: Outcome, call: Call, compare: Compare) -> None:
        """Starts `call` (the request, on the shadow candidate) in the background and
        compares its answer with `current` (`compare`: the task's); or drops it, counted,
        when busy."""
        if len(self._pending) >= self.max_pending or self._in_flight() >= self._near_limit:
            rollout.shadow_call("dropped")
            return
        task = asyncio.get_running_loop().create_task(self._run(rollout, current, call, compare))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _run(
        self, rollout: ModelRollout, current: Outcome, call: Call, compare: Compare
    ) -> None:
        # One turn of the loop first: the caller's answer goes out before the copy starts.
        await asyncio.sleep(0)
        rollout.shadow_call("sent")
        try:
            candidate = await call()
        except GatewayError as exc:
            _failed(rollout, current, "shadow call failed", exc)
            return
        except Exception:
            _failed(rollout, current, "shadow call failed unexpectedly")
            return
        if self._compare_thread is None:
            self._compare_thread = ThreadPoolExecutor(1, thread_name_prefix="compare")
        loop = asyncio.get_running_loop()
        try:
            comparison = await loop.run_in_executor(
                self._compare_thread, compare, current.result, candidate.result
            )
        except Exception:
            _failed(rollout, current, "shadow comparison failed")
            return
        rollout.record(comparison)

    async def drain(self) -> None:
        """Waits for the pending copies (tests; shutdown cancels them instead)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


def _failed(
    rollout: ModelRollout, current: Outcome, message: str, error: GatewayError | None = None
) -> None:
    """Counts a copy that failed and logs why: the candidate's error (a GatewayError) as
    information, anything else with its traceback (a bug in the gateway)."""
    rollout.shadow_call("failed")
    fields: dict[str, Any] = {"model": rollout.name, "request_id": current.request_id}
    if error is None:
        log.exception(message, extra={"fields": fields})
    else:
        fields.update(code=error.code, message=error.message)
        log.info(message, extra={"fields": fields})
