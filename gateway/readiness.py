"""Readiness that means something: ready only while TF Serving has the default model.

Polls TF Serving's GetModelStatus for the default model: ready while some version is
AVAILABLE, not ready otherwise, and back by itself when it recovers. Front doors subscribe
(gRPC health statuses) or read `ready` (HTTP /ping).

With `--workers N` the pod is one port served by N processes, and a probe reaches any one of
them: each worker publishes its own readiness into the supervisor's directory (a file per
worker, present while that worker listens and sees the model AVAILABLE) and is ready only
while all N files are there, so every worker gives the pod's answer. A worker that has the
model and waits only for its peers looks at their files every PEER_POLL seconds until its
next check, so the pod turns ready as soon as its last worker does, not an interval later.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from gateway.upstream.client import TFServingClient

log = logging.getLogger("gateway.health")

Listener = Callable[[bool], Awaitable[None]]
# Why the available model cannot be served (its signature does not fit its config), or None.
Refusal = Callable[[], Awaitable[str | None]]

# Set by the supervisor (gateway.workers) for each worker it starts.
GROUP_DIR_ENV = "GATEWAY_WORKER_READY_DIR"
GROUP_INDEX_ENV = "GATEWAY_WORKER_INDEX"
GROUP_COUNT_ENV = "GATEWAY_WORKER_COUNT"
# Seconds between looks at the peers' files while a worker waits only for them.
PEER_POLL = 0.1


class WorkerGroup:
    """The readiness of the workers of one supervisor, shared through a directory."""

    def __init__(self, directory: Path, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} is not in [0, {count})")
        self.directory = directory
        self.index = index
        self.count = count

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerGroup | None:
        """The group the supervisor put this worker in, or None when running alone."""
        environ = os.environ if environ is None else environ
        if GROUP_DIR_ENV not in environ:
            return None
        return cls(
            Path(environ[GROUP_DIR_ENV]),
            int(environ[GROUP_INDEX_ENV]),
            int(environ[GROUP_COUNT_ENV]),
        )

    def _path(self, index: int) -> Path:
        return self.directory / f"worker-{index}.ready"

    def publish(self, ready: bool) -> None:
        """Marks this worker ready (a file) or not (no file)."""
        path = self._path(self.index)
        if ready:
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def all_ready(self) -> bool:
        return all(self._path(index).exists() for index in range(self.count))


class Readiness:
    def __init__(
        self,
        client: TFServingClient,
        model: str,
        interval: float,
        group: WorkerGroup | None = None,
        refusal: Refusal | None = None,
    ) -> None:
        self._client = client
        self.model = model
        self._interval = interval
        self._group = group
        self._refusal = refusal
        self.reason: str | None = None  # why an available model is refused
        self.ready = False
        self._available = False
        self._known: bool | None = None
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """`listener(ready)` runs on every change (and after the first check)."""
        self._listeners.append(listener)

    async def check_once(self) -> bool:
        available = await self._client.model_available(
            self.model, timeout=max(min(self._interval, 5.0), 0.5)
        )
        self.reason = None
        if available and self._refusal is not None:
            # A model TF Serving has but the gateway cannot serve (its plan is refused):
            # not ready, so a rollout with a wrong model config stops here.
            self.reason = await self._refusal()
            available = self.reason is None
        if self._group is not None:
            self._group.publish(available)
        return await self._settle(available)

    async def _settle(self, available: bool) -> bool:
        """Readiness from this worker's model status and its peers' files; listeners and
        the log hear of a change."""
        self._available = available
        ready = available and (self._group is None or self._group.all_ready())
        self.ready = ready
        if ready != self._known:
            self._known = ready
            for listener in self._listeners:
                await listener(ready)
            fields: dict[str, object] = {"serving": ready, "model": self.model}
            if self.reason is not None:
                fields["reason"] = self.reason
            if self._group is not None:
                fields.update(model_available=available, worker=self._group.index)
            log.info("readiness changed", extra={"fields": fields})
        return ready

    def withdraw(self) -> None:
        """This worker is stopping: its peers stop counting it as ready."""
        self.ready = False
        self._available = False
        if self._group is not None:
            self._group.publish(False)

    async def run(self) -> None:
        while True:
            await self.check_once()
            await self._pause()

    async def _pause(self) -> None:
        """One interval; while this worker has the model and waits only for its peers, it
        looks at their files every PEER_POLL seconds meanwhile."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self._interval
        while self._group is not None and self._available and not self.ready:
            left = end - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(PEER_POLL, left))
            await self._settle(True)  # reads the peers' files; says so only on a change
        await asyncio.sleep(max(0.0, end - loop.time()))
