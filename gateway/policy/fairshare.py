"""Admission per caller: its quota (gateway.policy.quotas), then its fair share of the
gateway's limit (--max-concurrent-requests), so one caller's burst costs only that caller;
then, once the request's work is priced (gateway.domain.Cost, before any of it runs), the
same in work units (`charge`): the caller's work_concurrency, its work_rate bucket, and its
fair share of --max-concurrent-work, so one caller's heavy requests cannot take more than its
share of the CPU however few they are. A request alone is always let in (a caller with no work
in flight, and a full bucket, may send one request larger than its quota); a bucket may go
into debt by that much, paid back at the work rate. What a request did not use goes back when
it ends (release: a segmentation priced at its ceiling that pasted little).

Each request (one image; a stream's frames each) asks in turn:
1. the caller's concurrency: no more than its quota's requests in flight;
2. the caller's rate: a token bucket of `burst` tokens refilled at `rate` per second;
3. the gateway's limit: below it, anyone may go on; at it, only a caller within its fair
   share (the limit divided among the callers with requests in flight, itself included).
A caller within its share is never refused for the limit: it goes in even when callers above
their share hold the limit, and those are refused until they are back under it, so the
total stays below twice the limit and only ever comes down. Refusals are OVERLOADED
(RESOURCE_EXHAUSTED, HTTP 429) with a retry delay: when the bucket has a token again, or
for the concurrency and the limit about one request's time (a moving average).

Quotas are per gateway process (each replica, each --workers process), held on the event
loop. Metrics per caller label (the quota table's name; "other" for callers the file does
not name, "internal" for the gateway's own batch work), so the file bounds them.

The callers kept are bounded in number (--max-callers), not only in time: callers with nothing
in flight and a full bucket are forgotten first; past the ceiling, a new caller the quota file
does not name exactly shares one overflow entry per quota table (its rate, burst, concurrency
and fair share count for all of them together) until room is made. Refusals name the
caller's quota table, never the file's path on the server or how many others are active.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from gateway import errors
from gateway.config import Settings
from gateway.domain import Cost
from gateway.policy.quotas import INF, NO_QUOTAS, Quota, QuotaFile, Quotas

INTERNAL = ""  # the caller of the gateway's own work (in-process batch jobs): no quota
INTERNAL_QUOTA = Quota(label="internal", source="the gateway's own work")
# Callers kept with nothing in flight and a full bucket are the same as new ones: dropped
# once more than this many are kept, so identities seen once cost no memory for long.
_KEEP = 4096
# At the ceiling, the table is swept for room at most this often (a sweep is O(callers)).
_FULL_SWEEP_SECONDS = 1.0
# The overflow entries' keys: no identity holds a NUL (gateway.identity refuses them).
_OVERFLOW = "\0overflow:"
_HINT_FLOOR, _HINT_CEILING = 0.01, 10.0  # seconds: a retry delay stays in this range

ADMISSIONS = Counter(
    "vision_gateway_caller_requests",
    "Requests (images) by caller (its quota table; other: callers the quota file does not "
    "name) and decision: admitted, or refused for rate, concurrency or fair_share.",
    ["caller", "decision"],
)
OVERFLOWED = Counter(
    "vision_gateway_caller_overflow_requests",
    "Requests (images) counted under a shared overflow entry because the per-caller table "
    "held --max-callers callers (GATEWAY_MAX_CALLERS); raise it if this grows.",
)
IN_FLIGHT = Gauge(
    "vision_gateway_caller_in_flight_requests",
    "Requests (images) in flight by caller (its quota table; other: the rest).",
    ["caller"],
    multiprocess_mode="livesum",
)


WORK = Counter(
    "vision_gateway_caller_work_units",
    "Work units (megapixels decoded or pasted, megabytes of answer: gateway.domain.Cost) "
    "spent by caller (its quota table; other: the rest).",
    ["caller"],
)
WORK_IN_FLIGHT = Gauge(
    "vision_gateway_caller_in_flight_work_units",
    "Work units reserved by requests in flight, by caller (its quota table; other: the rest).",
    ["caller"],
    multiprocess_mode="livesum",
)


@dataclass(slots=True)
class Caller:
    """One caller's state; also the ticket a request holds while admitted."""

    identity: str
    quota: Quota
    generation: int
    tokens: float
    stamp: float
    in_flight: int = 0
    work_tokens: float = 0.0
    stamp_work: float = 0.0  # when work_tokens were last refilled (0: never charged)
    work_in_flight: float = 0.0


class FairShare:
    """The gateway's concurrency limit, shared fairly among callers, and their quotas."""

    def __init__(
        self,
        limit: int,
        quotas: QuotaFile | Quotas = NO_QUOTAS,
        clock: Callable[[], float] = time.monotonic,
        max_callers: int = 10_000,
        max_work: float = INF,
    ) -> None:
        self.limit = limit
        self.max_work = max_work
        self.work_in_flight = 0.0
        self.working = 0  # callers with work in flight
        self.max_callers = max_callers
        self._file = quotas if isinstance(quotas, QuotaFile) else None
        self._quotas = quotas.tables if isinstance(quotas, QuotaFile) else quotas
        self._clock = clock
        self.in_flight = 0
        self.active = 0  # callers with requests in flight
        self._callers: dict[str, Caller] = {}
        self._sweep_at = min(_KEEP, max_callers)
        self._full_sweep_at = 0.0  # at the ceiling: no sweep before this time
        self._hold = 0.05  # seconds a request holds its place, moving average
        self._children: dict[str, tuple[Counter, Gauge]] = {}
        self._work_children: dict[str, tuple[Counter, Gauge]] = {}

    def _caller(self, identity: str, now: float) -> Caller:
        generation = 0
        if self._file is not None:
            self._quotas = self._file.current(now)
            generation = self._file.generation
        state = self._callers.get(identity)
        if state is None or state.generation != generation:
            quota = INTERNAL_QUOTA if identity == INTERNAL else self._quotas.of(identity)
            if state is None:
                if len(self._callers) >= self._sweep_at and now >= self._full_sweep_at:
                    self._sweep(now)
                if len(self._callers) >= self.max_callers and not self._named(identity):
                    return self._overflow(quota, generation, now)
                state = Caller(identity, quota, generation, quota.burst, now)
                state.work_tokens = quota.work_burst
                self._callers[identity] = state
            else:  # the file changed: the new quota, the bucket kept within its size
                state.quota, state.generation = quota, generation
                state.tokens = min(state.tokens, quota.burst)
                state.work_tokens = min(state.work_tokens, quota.work_burst)
        return state

    def _named(self, identity: str) -> bool:
        """True for callers always kept: the file names them exactly (so it bounds them),
        and the gateway's own work."""
        return identity == INTERNAL or self._quotas.named(identity)

    def _overflow(self, quota: Quota, generation: int, now: float) -> Caller:
        """The entry shared by new callers of `quota`'s table while the table is full."""
        OVERFLOWED.inc()
        key = _OVERFLOW + quota.label
        state = self._callers.get(key)
        if state is None:
            state = Caller(key, quota, generation, quota.burst, now)
            state.work_tokens = quota.work_burst
            self._callers[key] = state  # one per table: the file bounds them
        elif state.generation != generation:
            state.quota, state.generation = quota, generation
            state.tokens = min(state.tokens, quota.burst)
            state.work_tokens = min(state.work_tokens, quota.work_burst)
        return state

    def check(self, identity: str) -> None:
        """Raises OVERLOADED when acquire() would refuse `identity` now, taking nothing: a
        door asks before it reads a request's body, so a caller over its quota or share costs
        the gateway no read and no parse (acquire still decides when the work starts)."""
        now = self._clock()
        self._admit(self._caller(identity, now), identity, now, take=False)

    def acquire(self, identity: str) -> Caller:
        """Admits one request of `identity` (a caller) or raises OVERLOADED; the ticket it
        returns goes back to release()."""
        now = self._clock()
        state = self._caller(identity, now)
        quota = state.quota
        self._admit(state, identity, now, take=True)
        if quota.rate != INF:
            state.tokens -= 1
        if state.in_flight == 0:
            self.active += 1
        state.in_flight += 1
        self.in_flight += 1
        admitted, in_flight = self._metrics(quota.label)
        admitted.inc()
        in_flight.inc()
        return state

    def _admit(self, state: Caller, identity: str, now: float, take: bool) -> None:
        """Refuses (OVERLOADED) what the caller's quota or fair share does not allow now;
        `take`: the bucket's refill is kept (acquire), else nothing changes (check)."""
        quota = state.quota
        if state.in_flight >= quota.concurrency:
            self._refuse(
                state,
                "concurrency",
                f"{_who(identity)} has {state.in_flight} images in flight, its limit "
                f"({quota.source}); wait for answers before sending more, or ask the "
                "gateway's operators for a larger quota",
                self._hold,
            )
        if quota.rate != INF:
            tokens = min(quota.burst, state.tokens + (now - state.stamp) * quota.rate)
            if take:
                state.tokens, state.stamp = tokens, now
            if tokens < 1:
                delay = (1 - tokens) / quota.rate
                self._refuse(
                    state,
                    "rate",
                    f"{_who(identity)} is over its rate of {quota.rate:g} requests per "
                    f"second (burst {quota.burst:g}; {quota.source}); retry in {delay:.3g} s, "
                    "or ask the gateway's operators for a larger quota",
                    delay,
                )
        if self.in_flight >= self.limit:
            active = self.active + (0 if state.in_flight else 1)
            share = self.limit / active
            if state.in_flight >= share:
                # How many others are active is theirs to know, not this caller's.
                self._refuse(
                    state,
                    "fair_share",
                    f"the gateway is working on its limit of {self.limit} images and "
                    f"{_who(identity)} holds {state.in_flight}, at or above its fair share "
                    "of that limit; retry with backoff, add gateway replicas or raise "
                    "GATEWAY_MAX_CONCURRENT_REQUESTS",
                    self._hold,
                )

    def charge(self, state: Caller, cost: Cost) -> None:
        """Reserves a request's priced work (admitted by acquire(), ticket `state`) from its
        caller's work quota and fair share of --max-concurrent-work, or raises OVERLOADED
        (nothing reserved)."""
        units = cost.units
        quota = state.quota
        who = _who(state.identity)
        busy = state.work_in_flight > 0
        if busy and state.work_in_flight + units > quota.work_concurrency:
            self._refuse(
                state,
                "work_concurrency",
                f"{who} has {state.work_in_flight:.3g} work units in flight and this image "
                f"needs {units:.3g} more, over its limit of {quota.work_concurrency:g} "
                f"({quota.source}); wait for answers, send smaller images or ask for less "
                "(max_detections), or ask the gateway's operators for a larger quota",
                self._hold,
            )
        now = self._clock()
        if quota.work_rate != INF:
            refill = (now - state.stamp_work) * quota.work_rate if state.stamp_work else 0.0
            state.work_tokens = min(quota.work_burst, state.work_tokens + refill)
            state.stamp_work = now
            needed = min(units, quota.work_burst)
            if state.work_tokens < needed:
                delay = (needed - state.work_tokens) / quota.work_rate
                self._refuse(
                    state,
                    "work_rate",
                    f"{who} is over its work rate of {quota.work_rate:g} work units per second "
                    f"(this image: {units:.3g}; {quota.source}); retry in {delay:.3g} s, send "
                    "smaller images or ask for less, or ask the gateway's operators for a "
                    "larger quota",
                    delay,
                )
        if busy and self.work_in_flight >= self.max_work:
            share = self.max_work / max(1, self.working)
            if state.work_in_flight >= share:
                self._refuse(
                    state,
                    "work_share",
                    f"the gateway is at its limit of work in flight and {who} holds "
                    f"{state.work_in_flight:.3g} work units, at or above its fair share of "
                    "it; retry with backoff, or ask the gateway's operators for more replicas",
                    self._hold,
                )
        if quota.work_rate != INF:
            state.work_tokens -= units
        if not busy:
            self.working += 1
        state.work_in_flight += units
        self.work_in_flight += units
        self._work(quota.label)[1].inc(units)

    def release(
        self, state: Caller, held: float, reserved: Cost | None = None, spent: Cost | None = None
    ) -> None:
        """A request admitted by acquire() is done, after `held` seconds; `reserved` is what
        charge() took, `spent` what it used (the rest goes back to the caller's bucket)."""
        if reserved is not None:
            units = reserved.units
            used = units if spent is None else min(units, spent.units)
            state.work_in_flight = max(0.0, state.work_in_flight - units)
            self.work_in_flight = max(0.0, self.work_in_flight - units)
            if state.work_in_flight == 0:
                self.working -= 1
            if state.quota.work_rate != INF:
                state.work_tokens = min(state.quota.work_burst, state.work_tokens + units - used)
            spent_counter, in_flight_work = self._work(state.quota.label)
            spent_counter.inc(used)
            in_flight_work.dec(units)
        state.in_flight -= 1
        self.in_flight -= 1
        if state.in_flight == 0:
            self.active -= 1
        self._hold += 0.05 * (held - self._hold)
        self._metrics(state.quota.label)[1].dec()

    def _refuse(self, state: Caller, reason: str, message: str, delay: float) -> None:
        ADMISSIONS.labels(state.quota.label, reason).inc()
        delay = min(_HINT_CEILING, max(_HINT_FLOOR, delay))
        raise errors.overloaded(message, retry_after=delay)

    def _metrics(self, label: str) -> tuple[Counter, Gauge]:
        children = self._children.get(label)
        if children is None:
            children = (ADMISSIONS.labels(label, "admitted"), IN_FLIGHT.labels(label))
            self._children[label] = children
        return children

    def _work(self, label: str) -> tuple[Counter, Gauge]:
        children = self._work_children.get(label)
        if children is None:
            children = (WORK.labels(label), WORK_IN_FLIGHT.labels(label))
            self._work_children[label] = children
        return children

    def _sweep(self, now: float) -> None:
        """Drops callers that hold nothing and whose bucket is full again."""
        for identity, state in list(self._callers.items()):
            quota = state.quota
            full = quota.rate == INF or state.tokens + (now - state.stamp) * quota.rate >= (
                quota.burst
            )
            work_full = quota.work_rate == INF or (
                state.work_tokens + (now - state.stamp_work) * quota.work_rate >= quota.work_burst
            )
            if state.in_flight == 0 and full and work_full:
                del self._callers[identity]
        self._sweep_at = min(max(_KEEP, 2 * len(self._callers)), self.max_callers)
        if len(self._callers) >= self.max_callers:
            self._full_sweep_at = now + _FULL_SWEEP_SECONDS

    @classmethod
    def for_settings(cls, settings: Settings) -> FairShare:
        """The limit and quota file (QuotaError when it cannot be used) of `settings`."""
        quotas = QuotaFile(settings.quotas) if settings.quotas else NO_QUOTAS
        return cls(
            settings.max_concurrent_requests,
            quotas,
            max_callers=settings.max_callers,
            max_work=settings.max_concurrent_work,
        )

    @property
    def callers(self) -> int:
        """Callers kept (for tests: identities seen once do not stay)."""
        return len(self._callers)


def _who(identity: str) -> str:
    return f"caller {identity}" if identity else "the gateway's own batch work"
