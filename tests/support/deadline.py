"""The deadline a call to a synchronous gRPC server came with, to forward to the next hop."""

from __future__ import annotations

import grpc

# A call without a deadline reports about 2**63 s remaining (gRPC's infinite future) from
# a synchronous server's context.time_remaining(), where grpc.aio reports None.
_NO_DEADLINE = 2.0**62


def forwarded_timeout(context: grpc.ServicerContext) -> float | None:
    """The seconds the caller has left, or None when it set no deadline.

    Passing the huge remaining time on as a timeout is not "no deadline": the client adds it
    to the clock and, as the sum rounds past 2**63, gRPC takes the deadline as already passed.
    The forwarded call then fails at once with DEADLINE_EXCEEDED, some of the time, depending
    on the clock: how test_jobs_cluster's runner lost whole streams behind
    tests/support/sidecar.py.
    """
    remaining = context.time_remaining()
    if remaining is None or remaining >= _NO_DEADLINE:
        return None
    return remaining
