"""A request's work in worker threads: run there and awaited to its end (`in_thread`), turned
into the caller's status when its deadline or its caller stopped it (`stops`), the time left
for a TF Serving call (`remaining`), what it really took (`spent`) for the caller's fair
share, and a call's admission with what its images were charged (`Account`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from typing import Any, TypeVar

from gateway.core.ports import Limit
from gateway.domain import Cost, Stopped, Work
from gateway.errors import GatewayError, Kind

T = TypeVar("T")


async def in_thread(executor: Executor, work: Work, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in one of `executor`'s threads. When the caller goes away meanwhile,
    the work is told to stop (Work.cancelled, which heavy mapping checks between strips)
    and awaited to its end before the cancellation goes on: the caller's concurrency slot
    is freed when its work has really stopped, not before."""
    future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        work.cancelled = True
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # retrieved: Stopped, or what the thread raised
        raise


@contextlib.contextmanager
def stops() -> Iterator[None]:
    """Work stopped by its deadline or its caller (Stopped) as the caller's status."""
    try:
        yield
    except Stopped as exc:
        raise stopped(exc) from None


def remaining(deadline: float | None, ceiling: float) -> float:
    """Seconds left for a TF Serving call: the caller's deadline (time.monotonic(); None:
    none), capped by `ceiling` (the gateway's upstream timeout); DEADLINE when it passed."""
    if deadline is None:
        return ceiling
    left = deadline - time.monotonic()
    if left <= 0:
        raise GatewayError(Kind.DEADLINE, "the call's deadline passed in the gateway")
    return min(left, ceiling)


def stopped(exc: Stopped) -> GatewayError:
    """The caller's status for work its deadline (DEADLINE_EXCEEDED) or its going away
    (CANCELLED) stopped."""
    if exc.deadline:
        return GatewayError(
            Kind.DEADLINE,
            "the call's deadline passed while the gateway worked on it; the work was stopped",
        )
    return GatewayError(Kind.CANCELLED, "the call was cancelled")


def spent(reserved: Cost | None, work: Work) -> Cost | None:
    """What a request's work really took: the decoding and answer priced, the masks its
    mapping pasted and wrote (Work), never more than was reserved."""
    if reserved is None:
        return None
    if not (work.mask_pixels or work.answer_bytes):
        return reserved
    return Cost(
        reserved.pixels,
        min(work.mask_pixels, reserved.mask_pixels),
        min(work.answer_bytes, reserved.answer_bytes),
        reserved.items,
    )


class Account:
    """One call's admission to the gateway's limit (a ticket of its caller's share), and the
    work its images were charged: one image's (Pipeline.run), or every image of a cascade's
    tree (gateway.core.cascade), each priced before it runs."""

    def __init__(self, limit: Limit, caller: str) -> None:
        self._limit = limit
        self._ticket = limit.acquire(caller)  # OVERLOADED: nothing taken
        self._started = time.perf_counter()
        self._charged: list[tuple[Cost, Work]] = []

    def charge(self, cost: Cost, work: Work) -> None:
        """Reserves one image's priced work (OVERLOADED: nothing reserved); `work` says
        what it really took once it has run."""
        self._limit.charge(self._ticket, cost)
        self._charged.append((cost, work))

    def release(self) -> None:
        """The call is done: its slot and what its images did not use go back."""
        if not self._charged:
            self._limit.release(self._ticket, time.perf_counter() - self._started, None, None)
            return
        if len(self._charged) == 1:  # one image's call: nothing to add up
            reserved, work = self._charged[0]
            used = spent(reserved, work) or reserved
        else:
            reserved = _total(cost for cost, _ in self._charged)
            used = _total(spent(cost, work) or cost for cost, work in self._charged)
        self._limit.release(self._ticket, time.perf_counter() - self._started, reserved, used)


def _total(costs: Iterable[Cost]) -> Cost:
    pixels = mask_pixels = answer_bytes = items = 0
    for cost in costs:
        pixels += cost.pixels
        mask_pixels += cost.mask_pixels
        answer_bytes += cost.answer_bytes
        items += cost.items
    return Cost(pixels, mask_pixels, answer_bytes, items)
