"""Readiness that means something: SERVING only while TF Serving has the default model.

The overall status ("") and detection.v1.DetectionService follow TF Serving's GetModelStatus
for the default model: SERVING while some version is AVAILABLE, NOT_SERVING otherwise, and
back by themselves when it recovers. The "liveness" service stays SERVING while the process
runs, so a liveness probe does not restart gateways because TF Serving is down.
"""

from __future__ import annotations

import asyncio
import logging

from grpc_health.v1 import health, health_pb2

from gateway.tfserving import TFServingClient

LIVENESS = "liveness"
log = logging.getLogger("gateway.health")


class HealthReporter:
    def __init__(
        self,
        servicer: health.aio.HealthServicer,
        client: TFServingClient,
        model: str,
        service_names: tuple[str, ...],
        interval: float,
    ) -> None:
        self._servicer = servicer
        self._client = client
        self._model = model
        self._names = ("", *service_names)
        self._interval = interval
        self._serving: bool | None = None

    async def check_once(self) -> bool:
        available = await self._client.model_available(
            self._model, timeout=max(min(self._interval, 5.0), 0.5)
        )
        if available != self._serving:
            self._serving = available
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if available
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in self._names:
                await self._servicer.set(name, status)
            log.info(
                "readiness changed",
                extra={"fields": {"serving": available, "model": self._model}},
            )
        return available

    async def run(self) -> None:
        await self._servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        while True:
            await self.check_once()
            await asyncio.sleep(self._interval)
