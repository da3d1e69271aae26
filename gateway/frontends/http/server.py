"""The HTTP door: aiohttp's server in the gateway's event loop, next to grpc.aio.

Its life: built with the routes (gateway.frontends.http.routes) and the error middleware,
started on its port (TLS with the gRPC port's certificate), drained on SIGTERM (/ping turns
503), stopped within the shutdown grace.
"""

from __future__ import annotations

from aiohttp import web

from gateway.api.bindings import Bindings
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline
from gateway.frontends.http.handlers import Handlers
from gateway.frontends.http.job_handlers import JobHandlers
from gateway.frontends.http.routes import register_routes
from gateway.jobs.control.service import JobService
from gateway.readiness import Readiness
from gateway.tls import server_ssl_context

# After answering 413 or 408 the rest of the body is read and dropped for at most this
# long, so the client sees the answer rather than a connection reset; then it is closed.
LINGER_SECONDS = 1.0


class HttpDoor:
    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        bindings: Bindings,
        readiness: Readiness,
        jobs: JobService | None = None,
        cascades: Cascades | None = None,
    ) -> None:
        self._settings = settings
        self.handlers = Handlers(
            settings, pipeline, bindings, readiness, jobs is not None, cascades
        )
        job_handlers = JobHandlers(settings, jobs) if jobs is not None else None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.app = web.Application(
            middlewares=[self.handlers.errors],
            client_max_size=settings.http_max_body_bytes,
        )
        register_routes(self.app, self.handlers, bindings, job_handlers)

    async def start(self) -> int:
        """Binds the port and serves; returns the bound port."""
        settings = self._settings
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,  # the request log is the pipeline's, one line per image
            shutdown_timeout=settings.shutdown_grace,
            keepalive_timeout=settings.http_header_timeout,
            lingering_time=LINGER_SECONDS,
            # A caller that hangs up cancels its request, as gRPC does: TF Serving's call
            # is cancelled and the slot freed.
            handler_cancellation=True,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            settings.host,
            settings.http_port,
            ssl_context=server_ssl_context(settings),
            # SO_REUSEPORT, as gRPC sets it on Linux: --workers N processes share the port.
            reuse_port=True,
        )
        await site.start()
        # The port bound: the one asked for, or the one the OS picked for port 0.
        self.port = self._runner.addresses[0][1]
        return self.port

    def drain(self) -> None:
        """From now on /ping answers 503, so load balancers stop sending new work."""
        self.handlers.draining = True

    async def stop(self) -> None:
        """Stops listening, lets in-flight requests finish within the shutdown grace."""
        if self._runner is not None:
            await self._runner.cleanup()
        self.handlers.encoder.close()
