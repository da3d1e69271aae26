"""The gateway's two front doors in the test process, for fast tests of the doors.

As MLServer's tests/grpc/conftest.py does: a real grpc.aio server and a real aiohttp app on
loopback ports the OS picks at bind time, over the real pipeline, readiness and model registry,
calling an in-process TF Serving built from the official protos (tests/support/fakeserving.py).
They run on an event loop in a thread of their own, so tests call them with ordinary blocking
clients (grpc stubs, urllib) and read the request log through `logging` (caplog). The whole
gateway as a process, with its signals and workers, is tests/e2e's.

    with InProcessDoors([detector()]) as doors:
        stub = DetectionServiceStub(grpc.insecure_channel(doors.grpc_target))
        urllib.request.urlopen(doors.http_url + "/ping")
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from gateway import policy
from gateway.api import bindings as api
from gateway.api.task import TaskRegistry
from gateway.app import built_in_tasks, load_models
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline
from gateway.frontends.grpc import server as grpc_door
from gateway.frontends.http.server import HttpDoor
from gateway.readiness import Readiness
from gateway.tasks.builtin import BUILT_IN
from gateway.upstream.client import TFServingClient
from tests.support.fakeserving import FakeModel, FakeServing

T = TypeVar("T")
HOST = "127.0.0.1"


class InProcessDoors:
    """Both doors over one pipeline, started on enter and stopped on exit.

    `settings` are gateway Settings fields (flags without dashes, e.g. max_concurrent_requests=1,
    model_config="models.toml"); host, ports and upstream are set here. `tasks` and `bindings`
    are the tasks served (default: the built-in ones), as `gateway.app.serve` takes them.
    """

    def __init__(
        self,
        models: list[FakeModel],
        *,
        tasks: TaskRegistry | None = None,
        bindings: api.Bindings = BUILT_IN,
        **settings: Any,
    ) -> None:
        self.serving = FakeServing({m.name: m for m in models})
        self._tasks = built_in_tasks() if tasks is None else tasks
        self._bindings = bindings
        self._settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="doors", daemon=True)
        self.settings: Settings
        self.pipeline: Pipeline
        self.readiness: Readiness
        self.grpc_port = 0
        self.http_port = 0

    @property
    def grpc_target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Runs `coroutine` on the doors' event loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def __enter__(self) -> InProcessDoors:
        self._thread.start()
        try:
            self.call(self._start())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with contextlib.suppress(Exception):
            self.call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    async def _start(self) -> None:
        self._grpc: grpc_door.GrpcDoor | None = None
        self._http: HttpDoor | None = None
        self._client: TFServingClient | None = None
        self._readiness_task: asyncio.Task[None] | None = None
        target = await self.serving.start()
        self.settings = Settings(
            **{
                "health_interval": 0.1,
                "shutdown_grace": 5.0,
                **self._settings,
                "host": HOST,
                "port": 0,
                "http_port": 0,
                "metrics_port": 0,
                "upstream": target,
            }
        )
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="decode")
        self._client = TFServingClient(self.settings)
        registry = load_models(self.settings, self._tasks)
        self.pipeline = Pipeline(
            self.settings,
            self._client,
            registry,
            self._executor,
            self._tasks,
            policy.build(self.settings, registry),
        )
        # The model config's pipelines ([pipelines.NAME]), on both doors as gateway.app serves them.
        cascades = Cascades(self.pipeline, registry.pipelines)
        self._grpc = grpc_door.build(self.settings, self.pipeline, self._bindings, None, cascades)
        await self._grpc.statuses.start()
        self.readiness = Readiness(
            self._client, registry.default_model, self.settings.health_interval, None
        )
        self.readiness.subscribe(self._grpc.statuses.on_readiness)
        self._http = HttpDoor(
            self.settings, self.pipeline, self._bindings, self.readiness, None, cascades
        )
        await self._grpc.server.start()
        self.grpc_port = self._grpc.port
        self.http_port = await self._http.start()
        self._readiness_task = asyncio.create_task(self.readiness.run())

    async def _stop(self) -> None:
        if self._readiness_task is not None:
            self._readiness_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._readiness_task
        if self._http is not None:
            await self._http.stop()
        if self._grpc is not None:
            await self._grpc.server.stop(0)
        if self._client is not None:
            await self._client.close()
        await self.serving.stop()
        self.pipeline.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
