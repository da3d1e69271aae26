"""When a call to TF Serving is tried again: UNAVAILABLE only (not TF Serving's full batch
queue), with jittered exponential backoff, within a budget that caps retries to a fraction of
calls."""

from __future__ import annotations

import random

import grpc

# Longest wait between two attempts of one call.
RETRY_BACKOFF_CAP = 1.0
# Retries the budget allows before it needs deposits from calls (a burst, e.g. every call
# in flight when a connection drops).
RETRY_RESERVE = 10.0


def is_queue_full(error: grpc.RpcError) -> bool:
    """TF Serving's UNAVAILABLE for a full batch queue ("The batch scheduling queue to which
    this task was submitted is full"): backpressure, never retried."""
    details = (error.details() or "").lower()
    return "queue" in details and "full" in details


def is_retryable(error: grpc.RpcError) -> bool:
    """UNAVAILABLE, whether from the transport (TF Serving down, restarting, connection
    reset) or from a server shutting down, except TF Serving's full batch queue: another
    attempt may reach a healthy server. Everything else is the answer."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and not is_queue_full(error)


class RetryBudget:
    """Caps retries to a fraction of calls: each call deposits `ratio` tokens (up to the
    reserve), each retry spends one. In an outage retries stop after the reserve, and then
    add at most `ratio` extra calls per call instead of multiplying the load."""

    def __init__(self, ratio: float, reserve: float = RETRY_RESERVE) -> None:
        self.ratio = ratio
        self.reserve = reserve
        self.tokens = reserve

    def deposit(self) -> None:
        self.tokens = min(self.reserve, self.tokens + self.ratio)

    def withdraw(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def backoff(attempt: int, base: float) -> float:
    """Seconds before attempt `attempt + 1`: full jitter over base * 2^(attempt-1), capped."""
    return random.uniform(0.0, min(RETRY_BACKOFF_CAP, base * 2 ** (attempt - 1)))
