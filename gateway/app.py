"""Composition root: builds the task registry, the core and the front doors, runs them, drains
on SIGTERM.

The tasks served are values given here: each a Task (gateway.tasks, registered in
gateway.tasks.builtin) with its binding. `start` takes others, which is how a test plugs in a
task of its own; `serve` is `start` until a signal, then `Gateway.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from gateway import memory, metrics, modelcheck, policy, tracing
from gateway.api import bindings as api
from gateway.api.task import TaskRegistry
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline
from gateway.frontends.grpc import server as grpc_door
from gateway.imaging import resize
from gateway.jobs.control.admission import Admission
from gateway.jobs.control.executor import Executor
from gateway.jobs.control.service import JobService
from gateway.jobs.control.store import JobStore
from gateway.jobs.executors.local import LocalExecutor
from gateway.jobs.transports.in_process import Lane
from gateway.labels import Labels
from gateway.models import ModelRegistry, default_registry, load_registry
from gateway.paylog.writer import PayloadLog
from gateway.readiness import Readiness, WorkerGroup
from gateway.tasks.builtin import built_in_tasks
from gateway.upstream.client import TFServingClient

if TYPE_CHECKING:
    from gateway.frontends.http.server import HttpDoor

log = logging.getLogger("gateway.server")


def load_models(settings: Settings, tasks: TaskRegistry) -> ModelRegistry:
    """The model registry from --model-config and --label-maps, for models of the `tasks`
    (each reads its own keys; LabelsError, ModelConfigError on bad files)."""
    label_maps = {
        name: Labels.load_label_map(Path(path)) for name, path in settings.label_maps.items()
    }
    if settings.model_config:
        return load_registry(
            Path(settings.model_config), settings.model, label_maps, tasks=tasks.config_readers
        )
    return default_registry(settings.model, label_maps, default_task=tasks.default)


class Gateway:
    """A started gateway: its doors listening, its readiness polling, its jobs running."""

    def __init__(
        self,
        settings: Settings,
        grpc: grpc_door.GrpcDoor,
        http: HttpDoor | None,
        readiness: Readiness,
        background: list[asyncio.Task[None]],
        jobs: JobService,
        client: TFServingClient,
        executor: ThreadPoolExecutor,
        pipeline: Pipeline,
        payload_log: PayloadLog | None = None,
    ) -> None:
        self.settings = settings
        self.grpc_port = grpc.port
        self.http_port = http.port if http is not None else 0
        self._grpc = grpc
        self._http = http
        self._readiness = readiness
        self._background = background  # readiness polling, the models' plans in the log
        self._jobs = jobs
        self._client = client
        self._executor = executor
        self._pipeline = pipeline
        self._payload_log = payload_log

    async def stop(self) -> None:
        """Drains and stops: in-flight requests get the shutdown grace to finish.

        Readiness goes NOT_SERVING (and /ping 503) first so load balancers stop sending new
        work; both doors refuse new API requests (gRPC: UNAVAILABLE while health checks still
        answer) and give the in-flight ones up to the grace period, side by side. Then the
        gRPC server stops, cutting what is left."""
        settings, grpc, http = self.settings, self._grpc, self._http
        log.info("shutting down", extra={"fields": {"grace_seconds": settings.shutdown_grace}})
        await grpc.health.enter_graceful_shutdown()
        if http is not None:
            http.drain()
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._readiness.withdraw()

        async def stop_grpc() -> None:
            left = await grpc.drain.drain(settings.shutdown_grace)
            if left:
                log.warning(
                    "grace period over; cancelling calls", extra={"fields": {"in_flight": left}}
                )
            await grpc.server.stop(0)

        stops = [stop_grpc()]
        if http is not None:
            stops.append(http.stop())
        await asyncio.gather(*stops)
        # Running batch jobs stop where they are (their state stays RUNNING) and resume on
        # start.
        await self._jobs.close()
        await self._client.close()
        if self._payload_log is not None:  # what is queued gets a few seconds to be written
            await asyncio.to_thread(self._payload_log.close)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pipeline.close()
        log.info("stopped")


async def start(
    settings: Settings,
    *,
    tasks: TaskRegistry | None = None,
) -> Gateway:
    """Builds the gateway and starts serving; `tasks` (default: built_in_tasks()) are the
    tasks served, each with its binding (its API)."""
    tasks = built_in_tasks() if tasks is None else tasks
    bindings = tasks.bindings
    memory.tune_malloc()  # before the decode threads exist
    registry = load_models(settings, tasks)
    tracing.setup()
    executor = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
    resize.use_threads(settings.decode_threads)
    client = TFServingClient(settings)
    pipeline = Pipeline(
        settings, client, registry, executor, tasks, policy.build(settings, registry)
    )
    payload_log = PayloadLog.for_settings(settings, bindings)
    if payload_log is not None:
        pipeline.observers.append(payload_log)
        payload_log.start()
    cascades = Cascades(pipeline, registry.pipelines)  # ModelConfigError: a bad pipeline
    jobs = build_jobs(settings, cascades, bindings)
    grpc = grpc_door.build(settings, pipeline, bindings, jobs, cascades)
    await grpc.statuses.start()
    readiness = Readiness(
        client,
        registry.default_model,
        settings.health_interval,
        WorkerGroup.from_environ(),
        refusal=partial(
            modelcheck.refusal,
            client,
            registry,
            tasks,
            registry.default_model,
            settings.upstream_timeout,
        ),
    )
    readiness.subscribe(grpc.statuses.on_readiness)
    http: HttpDoor | None = None
    if settings.http_port:
        # Imported only when enabled: aiohttp adds to the footprint only when it is used.
        from gateway.frontends.http.server import HttpDoor

        http = HttpDoor(settings, pipeline, bindings, readiness, jobs, cascades)
    metrics.serve(settings.metrics_port, settings.host)
    await grpc.server.start()
    await jobs.start()
    if http is not None:
        await http.start()
    background = [
        asyncio.create_task(readiness.run()),
        # Each model's plan (or why it cannot be served) in the log, once, without delaying
        # start.
        asyncio.create_task(
            modelcheck.log_plans(client, registry, tasks, settings.upstream_timeout)
        ),
    ]
    gateway = Gateway(
        settings, grpc, http, readiness, background, jobs, client, executor, pipeline,
        payload_log,
    )  # fmt: skip
    log.info(
        "gateway listening",
        extra={
            "fields": {
                "address": f"{settings.host}:{gateway.grpc_port}",
                "http_port": gateway.http_port or None,
                "upstream": settings.upstream,
                "model": registry.default_model,
                "models": sorted(registry.models),
                "metrics_port": settings.metrics_port,
                "tls": _tls_mode(settings.tls_cert_file, settings.tls_client_ca_file),
                "upstream_tls": _tls_mode(settings.upstream_uses_tls, settings.upstream_cert_file),
            }
        },
    )
    return gateway


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Runs the gateway until SIGTERM/SIGINT, then lets in-flight requests finish within the
    grace; `ready` is set once it serves."""
    gateway = await start(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    await gateway.stop()


def build_jobs(settings: Settings, cascades: Cascades, bindings: api.Bindings) -> JobService:
    """Batch jobs over the API and their executor (the local one runs them on the gateway's
    own pipeline: a task's model, or one of the `cascades`)."""
    store = JobStore(settings.job_store, settings.job_store_max_bytes)

    def executor(service: JobService) -> Executor:
        if settings.batch_executor == "kubernetes":
            # imports the kubernetes client
            from gateway.jobs.executors.kube import KubernetesExecutor

            return KubernetesExecutor(service, settings)
        return LocalExecutor(service, settings, Lane(cascades, settings.batch_yield_threshold))

    return JobService(Admission(settings, store, cascades, bindings), executor)


def _tls_mode(tls: object, mutual: object) -> str:
    """off, tls, or mtls (both sides present certificates), for the startup log."""
    return "mtls" if tls and mutual else "tls" if tls else "off"
