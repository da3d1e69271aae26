"""Readiness that means something: ready only while TF Serving has the default model.

Polls TF Serving's GetModelStatus for the default model: ready while some version is
AVAILABLE, not ready otherwise, and back by itself when it recovers. Front doors subscribe
(gRPC health statuses) or read `ready` (HTTP /ping).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gateway.upstream.client import TFServingClient

log = logging.getLogger("gateway.health")

Listener = Callable[[bool], Awaitable[None]]


class Readiness:
    def __init__(self, client: TFServingClient, model: str, interval: float) -> None:
        self._client = client
        self.model = model
        self._interval = interval
        self.ready = False
        self._known: bool | None = None
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """`listener(ready)` runs on every change (and after the first check)."""
        self._listeners.append(listener)

    async def check_once(self) -> bool:
        available = await self._client.model_available(
            self.model, timeout=max(min(self._interval, 5.0), 0.5)
        )
        self.ready = available
        if available != self._known:
            self._known = available
            for listener in self._listeners:
                await listener(available)
            log.info(
                "readiness changed",
                extra={"fields": {"serving": available, "model": self.model}},
            )
        return available

    async def run(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self._interval)
