"""The HTTP door: aiohttp's server in the gateway's event loop, next to grpc.aio.

Routes (gateway.frontends.http.openapi describes them):
    POST /v1/models/{model}[/versions/{n} | /labels/{label}]:detect | :classify
    POST /invocations          the default model with its task (SageMaker-style hosting)
    GET  /ping                 200 {} while the default model is AVAILABLE, else 503
    GET  /v1/models/{model}[/versions/{n} | /labels/{label}]   TF Serving's model status
    GET  /openapi.json, GET /  (the description, and a page to try the API in a browser)

Convert and delegate, as the gRPC door does: the body is read within its size limit and
time, decoded by Content-Type (gateway.frontends.http.codecs) into the public API's request
message, handed to the pipeline (which takes the concurrency slot only then), and the result
or error is encoded as JSON or MessagePack. Errors take their HTTP status from one table
(gateway.frontends.http.status).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from aiohttp import web

# aiohttp's answer to `Expect: 100-continue`, used for bodies within the limit.
from aiohttp.web_urldispatcher import _default_expect_handler
from google.rpc import code_pb2

from gateway import errors, logs, metrics
from gateway.config import Settings
from gateway.core.domain import ModelRef, Outcome, Request
from gateway.core.pipeline import Pipeline, new_request_id
from gateway.errors import GatewayError, Kind
from gateway.frontends.grpc import converters
from gateway.frontends.grpc.servicers import TRACE_HEADERS
from gateway.frontends.http import codecs, openapi, page
from gateway.frontends.http.status import (
    STATUS,
    HttpError,
    body_timeout,
    method_not_allowed,
    not_found,
    unsupported_media_type,
)
from gateway.models import CLASSIFICATION, DETECTION, ModelRegistry
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.readiness import Readiness
from gateway.upstream.client import TFServingClient

log = logging.getLogger("gateway.http")
request_log = logs.RequestLog()

# After answering 413 or 408 the rest of the body is read and dropped for at most this
# long, so the client sees the answer rather than a connection reset; then it is closed.
LINGER_SECONDS = 1.0
# Path segments: anything but "/" and ":" (the ":detect" verb follows the model name).
SEGMENT = "[^/:]+"
REQUEST_ID = "x-request-id"


@dataclass(frozen=True)
class Task:
    """What a task's routes need: the pipeline task, request message, result converter."""

    name: str
    verb: str  # detect | classify
    new_request: Callable[[], codecs.ApiRequest]
    to_request: Callable[..., Request]
    to_result: Callable[[Outcome], codecs.ApiResult]


TASKS = {
    DETECTION: Task(
        DETECTION,
        "detect",
        pb.DetectRequest,
        converters.to_detect,
        converters.to_detection_result,
    ),
    CLASSIFICATION: Task(
        CLASSIFICATION,
        "classify",
        cpb.ClassifyRequest,
        converters.to_classify,
        converters.to_classification_result,
    ),
}


def _wants_msgpack(request: web.Request, body_is_msgpack: bool) -> bool:
    """MessagePack when Accept names it before JSON; with no preference (no Accept, */*),
    the request's own format."""
    for item in request.headers.get("Accept", "").split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in codecs.MSGPACK_TYPES:
            return True
        if media in (codecs.JSON, "application/*"):
            return False
    return body_is_msgpack


def _error_response(
    status: int, code: str, message: str, request_id: str, as_msgpack: bool
) -> web.Response:
    response = web.Response(
        status=status,
        body=codecs.error_body(code, message, as_msgpack),
        content_type=codecs.MSGPACK if as_msgpack else codecs.JSON,
    )
    if request_id:
        response.headers[REQUEST_ID] = request_id
    return response


class HttpDoor:
    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        client: TFServingClient,
        registry: ModelRegistry,
        readiness: Readiness,
    ) -> None:
        self._settings = settings
        self._pipeline = pipeline
        self._client = client
        self._registry = registry
        self._readiness = readiness
        self._draining = False
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.app = self._build_app()

    # --- lifecycle ----------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors],
            client_max_size=self._settings.http_max_body_bytes,
        )
        add = app.router.add_route
        for task in TASKS.values():
            handler = partial(self._predict, task)
            expect = partial(self._expect, f"POST :{task.verb}")
            base = f"/v1/models/{{model:{SEGMENT}}}"
            add("POST", f"{base}:{task.verb}", handler, expect_handler=expect)
            for choice in ("versions/{version", "labels/{label"):
                path = f"{base}/{choice}:{SEGMENT}}}:{task.verb}"
                add("POST", path, handler, expect_handler=expect)
        add(
            "POST",
            "/invocations",
            self._invocations,
            expect_handler=partial(self._expect, "POST /invocations"),
        )
        add("GET", "/ping", self._ping)
        add("GET", f"/v1/models/{{model:{SEGMENT}}}", self._model_status)
        add(
            "GET",
            f"/v1/models/{{model:{SEGMENT}}}/versions/{{version:{SEGMENT}}}",
            self._model_status,
        )
        add("GET", f"/v1/models/{{model:{SEGMENT}}}/labels/{{label:{SEGMENT}}}", self._model_status)
        add("GET", "/openapi.json", self._openapi)
        add("GET", "/", self._page)
        return app

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
        self.port = site.port
        return self.port

    def drain(self) -> None:
        """From now on /ping answers 503, so load balancers stop sending new work."""
        self._draining = True

    async def stop(self) -> None:
        """Stops listening, lets in-flight requests finish within the shutdown grace."""
        if self._runner is not None:
            await self._runner.cleanup()

    # --- middleware: unknown routes, wrong methods, unexpected failures as JSON errors ----

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed as e:
            allowed = ", ".join(sorted(e.allowed_methods))
            error = method_not_allowed(
                f"{request.method} is not allowed on {request.path}; use {allowed}"
            )
            response = self._http_error(request, error)
            response.headers["Allow"] = allowed
            return response
        except web.HTTPNotFound:
            return self._http_error(
                request,
                not_found(
                    f"no route {request.method} {request.path}; see GET /openapi.json for the "
                    "routes"
                ),
            )
        except web.HTTPException as e:
            # aiohttp's own refusals (e.g. a bad Expect header): its status, as JSON.
            return self._http_error(request, HttpError(e.status, "INVALID_ARGUMENT", e.reason))
        except Exception:
            # A bug in the door (the pipeline turns its own into INTERNAL): logged with its
            # traceback, answered without details, as the pipeline does.
            request_id = request.headers.get(REQUEST_ID, "") or new_request_id()
            log.exception("unexpected error", extra={"fields": {"request_id": request_id}})
            message = f"internal error in the gateway; quote request id {request_id}"
            return _error_response(
                500, Kind.INTERNAL.code, message, request_id, _wants_msgpack(request, False)
            )

    def _http_error(self, request: web.Request, error: HttpError) -> web.Response:
        request_id = request.headers.get(REQUEST_ID, "") or new_request_id()
        return _error_response(
            error.status, error.code, error.message, request_id, _wants_msgpack(request, False)
        )

    # --- predictions ----------------------------------------------------------------------

    async def _predict(self, task: Task, request: web.Request) -> web.StreamResponse:
        match = request.match_info
        path_model = PathModel(match["model"], match.get("version"), match.get("label"))
        return await self._run(task, request, f"POST :{task.verb}", path_model)

    async def _invocations(self, request: web.Request) -> web.StreamResponse:
        default = self._registry.default_model
        config = self._registry.models.get(default)
        task = TASKS[config.task if config is not None else DETECTION]
        return await self._run(task, request, "POST /invocations", None)

    async def _run(
        self, task: Task, request: web.Request, method: str, path_model: PathModel | None
    ) -> web.StreamResponse:
        started = time.perf_counter()
        header_id = request.headers.get(REQUEST_ID, "")
        trace = tuple(
            (key.lower(), value)
            for key, value in request.headers.items()
            if key.lower() in TRACE_HEADERS
        )
        kind = codecs.body_kind(request.content_type.lower())
        as_msgpack = _wants_msgpack(request, kind == codecs.Kind.MSGPACK)
        try:
            decoded = await self._request_message(task, request, kind, path_model)
        except (GatewayError, HttpError) as e:
            # Refused before the pipeline: counted and logged here, like the pipeline does.
            request_id = header_id or new_request_id()
            status = e.status if isinstance(e, HttpError) else STATUS[e.kind]
            self._record_rejection(method, e.code, request_id, started, status)
            response = _error_response(status, e.code, e.message, request_id, as_msgpack)
            if status in (408, 413):
                response.force_close()  # the rest of the body is not read
            return response
        message = decoded.message
        request_id = message.request_id or header_id or new_request_id()
        try:
            outcome = await self._pipeline.run(
                task.name, task.to_request(message, request_id, method, None, trace)
            )
        except GatewayError as e:
            return _error_response(STATUS[e.kind], e.code, e.message, request_id, as_msgpack)
        result = task.to_result(outcome)
        if as_msgpack:
            body = codecs.to_msgpack(result, decoded.metadata)
        else:
            body = codecs.to_json(result, decoded.metadata)
        return web.Response(
            body=body,
            content_type=codecs.MSGPACK if as_msgpack else codecs.JSON,
            headers={REQUEST_ID: request_id},
        )

    async def _request_message(
        self, task: Task, request: web.Request, kind: str | None, path_model: PathModel | None
    ) -> codecs.Decoded:
        """The body read and decoded into the task's request message, with the query's
        options and the path's model applied."""
        if kind is None:
            raise unsupported_media_type(
                f"Content-Type {request.content_type or '(none)'} is not supported; send one "
                f"of {', '.join(codecs.ACCEPTED)}"
            )
        body = await self._read_body(request, kind)
        decoded = await self._decode(kind, request, body, task.new_request())
        message = decoded.message
        codecs.apply_query(message, request.query, allow_model=path_model is None)
        if path_model is not None:
            _set_path_model(message, path_model.ref())
        elif not message.model.name:
            message.model.name = self._registry.default_model
        return decoded

    def _body_limit(self, kind: str) -> int:
        # JSON carries the image as base64 (4/3 of its size); the other forms carry it as is.
        if kind == codecs.Kind.JSON:
            return self._settings.http_max_body_bytes
        return self._settings.server_max_receive_bytes

    async def _expect(self, method: str, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: a body declared over the limit is refused before the
        client sends it; otherwise aiohttp's own handling (100 Continue)."""
        kind = codecs.body_kind(request.content_type.lower())
        length = request.content_length
        if kind is not None and length is not None and length > self._body_limit(kind):
            error = _too_large(length, self._body_limit(kind))
            request_id = request.headers.get(REQUEST_ID, "") or new_request_id()
            self._record_rejection(method, error.code, request_id, time.perf_counter(), 413)
            response = _error_response(
                413,
                error.code,
                error.message,
                request_id,
                _wants_msgpack(request, kind == codecs.Kind.MSGPACK),
            )
            response.force_close()
            return response
        await _default_expect_handler(request)
        return None

    async def _read_body(self, request: web.Request, kind: str) -> bytes:
        """The whole body, refused (413) past the limit before it is buffered: first by
        Content-Length, then while streaming; 408 when it does not arrive in time."""
        settings = self._settings
        limit = self._body_limit(kind)
        length = request.content_length
        if length is not None and length > limit:
            raise _too_large(length, limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(settings.http_body_timeout):
                async for chunk in request.content.iter_any():
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(size, limit, streamed=True)
                    chunks.append(chunk)
        except TimeoutError:
            raise body_timeout(
                f"the request body did not arrive within {settings.http_body_timeout:g} s "
                f"({size} bytes received); GATEWAY_HTTP_BODY_TIMEOUT sets the limit"
            ) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _decode(
        self, kind: str, request: web.Request, body: bytes, message: codecs.ApiRequest
    ) -> codecs.Decoded:
        if kind == codecs.Kind.JSON:
            return codecs.decode_json(body, message)
        if kind == codecs.Kind.MSGPACK:
            return codecs.decode_msgpack(body, message)
        if kind == codecs.Kind.MULTIPART:
            # The email parser is pure Python: off the event loop for large forms.
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                None, codecs.decode_multipart, request.headers["Content-Type"], body, message
            )
        message.image = body
        return codecs.Decoded(message)

    def _record_rejection(
        self, method: str, code: str, request_id: str, started: float, status: int
    ) -> None:
        """Requests refused before the pipeline are counted and logged like the others."""
        total = time.perf_counter() - started
        metrics.record(method, code, total, 0.0, 0.0)
        if request_log.enabled():
            fields = {
                "method": method,
                "code": code,
                "request_id": request_id,
                "http_status": status,
                "latency_ms": {"total": round(total * 1000, 2)},
            }
            request_log.write(fields)

    # --- health, status, description, page ----------------------------------------------

    async def _ping(self, request: web.Request) -> web.StreamResponse:
        if self._readiness.ready and not self._draining:
            return web.Response(body=b"{}", content_type=codecs.JSON)
        reason = (
            "the gateway is shutting down"
            if self._draining
            else f"model '{self._readiness.model}' is not AVAILABLE on TF Serving"
        )
        return _error_response(503, Kind.UNAVAILABLE.code, reason, "", False)

    async def _model_status(self, request: web.Request) -> web.StreamResponse:
        match = request.match_info
        as_msgpack = _wants_msgpack(request, False)
        try:
            model = PathModel(match["model"], match.get("version"), match.get("label")).ref()
            if model.version is not None and model.version <= 0:
                raise errors.invalid_input(
                    f"version must be a positive integer, got {model.version}"
                )
            status = await self._client.model_status(model, self._settings.upstream_timeout)
        except GatewayError as e:
            return _error_response(STATUS[e.kind], e.code, e.message, "", as_msgpack)
        body = {"model_version_status": [_version_status(s) for s in status.model_version_status]}
        return web.Response(
            body=json.dumps(body, separators=(",", ":")).encode(), content_type=codecs.JSON
        )

    async def _openapi(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=json.dumps(openapi.document(self._registry)).encode(), content_type=codecs.JSON
        )

    async def _page(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=page.render(self._registry).encode(),
            content_type="text/html",
            charset="utf-8",
            headers={
                # Everything the page needs is inline; nothing may load from elsewhere.
                "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                "style-src 'unsafe-inline'; img-src blob: data:; connect-src 'self' data:",
            },
        )


@dataclass(frozen=True)
class PathModel:
    """The model as a route's path names it (segments as text)."""

    name: str
    version: str | None
    label: str | None

    def ref(self) -> ModelRef:
        if self.version is None:
            return ModelRef(self.name, None, self.label)
        try:
            version = int(self.version)
        except ValueError:
            raise errors.invalid_input(
                f"version in the path must be a whole number, got {self.version!r}; use "
                "/labels/{label} for a version label"
            ) from None
        return ModelRef(self.name, version, None)


def _set_path_model(message: codecs.ApiRequest, model: ModelRef) -> None:
    """The path names the model; a body may repeat it but not name another."""
    spec = message.model
    if spec.name and spec.name != model.name:
        raise errors.invalid_input(
            f"the body names model '{spec.name}' but the path names '{model.name}'; "
            "leave model out of the body or make them the same"
        )
    spec.name = model.name
    if model.version is not None:
        spec.version = model.version
    elif model.label is not None:
        spec.label = model.label


def _too_large(size: int, limit: int, streamed: bool = False) -> GatewayError:
    what = f"more than {limit}" if streamed else f"{size}"
    return GatewayError(
        Kind.TOO_LARGE,
        f"the request body is {what} bytes; the limit is {limit} bytes (the image limit "
        "GATEWAY_MAX_IMAGE_BYTES plus room for the rest of the request): send a smaller image "
        "or raise GATEWAY_MAX_IMAGE_BYTES",
    )


def _version_status(status: tfs.ModelVersionStatus) -> dict[str, object]:
    """TF Serving REST's form: version as a string (int64 in proto3 JSON), names for enums."""
    code = status.status.error_code
    code_name = code_pb2.Code.Name(code) if code in code_pb2.Code.values() else str(code)
    return {
        "version": str(status.version),
        "state": tfs.ModelVersionStatus.State.Name(status.state),
        "status": {"error_code": code_name, "error_message": status.status.error_message},
    }


def server_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """TLS on the HTTP port with the gRPC port's certificate (mTLS with its client CA)."""
    if not settings.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_client_ca_file:
        context.load_verify_locations(settings.tls_client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
