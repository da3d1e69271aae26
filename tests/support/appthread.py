"""The gateway app (gateway.app.start, with the tasks a test gives it) in its own event loop on
a thread: started on enter, drained and stopped on exit."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from gateway import app
from gateway.api.task import TaskRegistry
from gateway.config import Settings


class GatewayThread:
    """The app started in its own event loop on a thread; stopped (drained) on exit."""

    def __init__(self, settings: Settings, tasks: TaskRegistry) -> None:
        self._args = (settings, tasks)
        self._started: Future[app.Gateway] = Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        settings, tasks = self._args
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            gateway = await app.start(settings, tasks=tasks)
        except BaseException as exc:
            self._started.set_exception(exc)
            raise
        self._started.set_result(gateway)
        await self._stop.wait()
        await gateway.stop()

    def __enter__(self) -> app.Gateway:
        self._thread.start()
        return self._started.result(timeout=120)

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()
