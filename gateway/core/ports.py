"""What the pipeline asks of the collaborators the app hands it, as Protocols: the concurrency
limit with each caller's quota and fair share, the rollouts that pick a version per request,
the shadow copies (gateway.policy implements all three). The core imports no policy module:
it is given a `Policy` and calls it through these."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

from gateway.domain import Comparison, Cost, ModelRef, Outcome


class Limit(Protocol):
    """Admits a request of a caller, or raises GatewayError OVERLOADED; then its work, once
    priced (Cost, before any of it runs), within the caller's share of the gateway's work."""

    in_flight: int  # requests admitted and not yet released

    def acquire(self, caller: str) -> Any:  # a ticket for charge() and release()
        ...

    def check(self, caller: str) -> None:
        """Raises OVERLOADED when acquire() would refuse `caller` now, taking nothing."""
        ...

    def charge(self, ticket: Any, cost: Cost) -> None:
        """Reserves the priced work of the request admitted with `ticket` from its caller's
        work quota and fair share, or raises OVERLOADED (nothing reserved)."""
        ...

    def release(self, ticket: Any, held: float, reserved: Cost | None, spent: Cost | None) -> None:
        """The request admitted with `ticket` is done, after `held` seconds; `reserved` is
        what charge() took (None: nothing), `spent` what its work really took (at most that:
        the rest goes back to the caller)."""
        ...


class Router(Protocol):
    """Which version of a model a request gets (a rollout's canary, or the current one)."""

    def route(self, model: ModelRef, caller: str, request_id: str) -> tuple[ModelRef, Any]:
        """The model to call, and what to copy the request's answer to (None: nothing)."""
        ...

    def summary(self, model: str) -> dict[str, Any] | None:
        """The model's rollout statistics; None when it has no rollout."""
        ...


class ShadowCopies(Protocol):
    """Copies of answered requests to a rollout's shadow candidate, in the background; their
    answers compared with the caller's by `compare` (the task's, run off the event loop)."""

    def send(
        self,
        rollout: Any,
        current: Outcome,
        call: Callable[[], Awaitable[Outcome]],
        compare: Callable[[Any, Any], Comparison],
    ) -> None: ...

    async def drain(self) -> None:
        """Waits for the pending copies."""
        ...

    def close(self) -> None:
        """Stops the comparison thread (shutdown)."""
        ...


class Policy(NamedTuple):
    """Who may do how much, and which version answers: built by gateway.policy.build."""

    limit: Limit
    rollouts: Router
    shadows: ShadowCopies
