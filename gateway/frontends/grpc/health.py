"""grpc.health.v1 statuses from the gateway's readiness.

The overall status ("") and each API service follow gateway.readiness: SERVING while TF
Serving has the default model AVAILABLE, NOT_SERVING otherwise. The "liveness" service stays
SERVING while the process runs, so a liveness probe does not restart gateways because TF
Serving is down.
"""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

LIVENESS = "liveness"


class HealthStatuses:
    def __init__(self, servicer: health.aio.HealthServicer, service_names: tuple[str, ...]):
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
