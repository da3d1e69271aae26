"""grpc.health.v1: the servicer, and its statuses from the gateway's readiness.

The overall status ("") and each API service follow gateway.readiness: SERVING while TF
Serving has the default model AVAILABLE (and, with --workers, while every worker is ready),
NOT_SERVING otherwise. The "liveness" service stays SERVING while the process runs, so a
liveness probe does not restart gateways because TF Serving is down.

The servicer is grpcio-health-checking's, except that `Watch` streams end once shutdown has
begun and NOT_SERVING has been sent: the reference servicer keeps them open, and a server
stopping with a grace period waits for every open call, so one watcher (Envoy, a client's
health checking) held the drain open until the grace ran out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

LIVENESS = "liveness"
# HealthCheckResponse.ServingStatus values (SERVING, NOT_SERVING, SERVICE_UNKNOWN).
Status = int


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Check and Watch over statuses set with `set`; `enter_graceful_shutdown` turns every
    status NOT_SERVING for good and ends the Watch streams."""

    def __init__(self) -> None:
        self._statuses: dict[str, Status] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._changes = 0
        self._changed: asyncio.Condition | None = None  # made in the server's event loop
        self.shutting_down = False

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._statuses.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        unknown = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        changed = self._condition()
        last: Status | None = None
        while True:
            async with changed:
                seen = self._changes
                status = self._statuses.get(request.service, unknown)
                stopping = self.shutting_down
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            if stopping:
                return
            async with changed:
                await changed.wait_for(lambda: self._changes != seen)  # noqa: B023

    async def set(self, service: str, status: Status) -> None:
        """Sets a service's status (ignored once shutdown has begun)."""
        if not self.shutting_down:
            await self._set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        """Every status NOT_SERVING from now on; Watch streams send it and end."""
        if self.shutting_down:
            return
        self.shutting_down = True
        for service in list(self._statuses):
            self._statuses[service] = health_pb2.HealthCheckResponse.NOT_SERVING
        await self._set("", health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _set(self, service: str, status: Status) -> None:
        changed = self._condition()
        async with changed:
            self._statuses[service] = status
            self._changes += 1
            changed.notify_all()


class HealthStatuses:
    def __init__(self, servicer: HealthServicer, service_names: tuple[str, ...]):
        self._servicer = servicer
        self._names = ("", *service_names)

    async def start(self) -> None:
        """NOT_SERVING until the first readiness check; liveness SERVING from now on."""
        for name in self._names:
            await self._servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)

    async def on_readiness(self, ready: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self._names:
            await self._servicer.set(name, status)
