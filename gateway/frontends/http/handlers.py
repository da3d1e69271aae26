"""The HTTP door's handlers: convert and delegate, as the gRPC door does (routes:
gateway.frontends.http.routes).

A prediction's body is read within its size limit and time, decoded by Content-Type
(gateway.frontends.http.bodies) into the binding's request message, handed to the pipeline
(which takes the concurrency slot only then), and the result or error is encoded as JSON or
MessagePack (gateway.frontends.http.responses). Errors take their HTTP status from one table
(gateway.frontends.http.status).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from aiohttp import web

# aiohttp's answer to `Expect: 100-continue`, used for bodies within the limit.
from aiohttp.web_urldispatcher import _default_expect_handler
from google.rpc import code_pb2

from gateway import errors, identity, logs, metrics
from gateway.api import pipelines, strings
from gateway.api.bindings import TRACE_HEADERS, Binding, Bindings, ToRequest
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline, new_request_id
from gateway.domain import Outcome, Request
from gateway.errors import GatewayError, Kind
from gateway.frontends.http import bodies, openapi, page
from gateway.frontends.http.limits import BodyLimits
from gateway.frontends.http.paths import PathModel, set_path_model
from gateway.frontends.http.responses import (
    REQUEST_ID,
    Encoder,
    error_response,
    wants_msgpack,
)
from gateway.frontends.http.status import (
    STATUS,
    HttpError,
    method_not_allowed,
    not_found,
    unsupported_media_type,
)
from gateway.proto.pipeline.v1.pipeline_pb2 import RunRequest
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.readiness import Readiness

log = logging.getLogger("gateway.http")
request_log = logs.RequestLog()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Handlers:
    """Every route's handler over one pipeline."""

    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        bindings: Bindings,
        readiness: Readiness,
        jobs: bool = False,
        cascades: Cascades | None = None,
    ) -> None:
        self._settings = settings
        self._cascades = cascades or Cascades(pipeline, {})
        self._results = pipelines.Results(bindings)
        self._jobs = jobs  # the batch jobs routes are there (described, and on the page)
        self._pipeline = pipeline
        self._bindings = bindings
        page.renderers(bindings)  # a page script the page cannot inline is refused at startup
        self._readiness = readiness
        self._body_limits = BodyLimits(
            settings.http_max_metadata_bytes, settings.http_max_metadata_keys
        )
        self.draining = False  # set on SIGTERM: /ping answers 503 from then on
        self.encoder = Encoder()  # large answers encoded off the event loop
        # Who reads operator views; AdminsError (the gateway does not start) for a bad entry.
        self._operators = identity.Operators(
            (e.strip() for e in settings.operator_identities.split(",") if e.strip()),
            callers_known=bool(settings.tls_client_ca_file) or settings.trust_xfcc,
        )

    # --- unknown routes, wrong methods, unexpected failures as JSON errors (middleware) -----

    @web.middleware
    async def errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            error = method_not_allowed(
                f"{request.method} is not allowed on {request.path}; use {allowed}"
            )
            response = _http_error(request, error)
            response.headers["Allow"] = allowed
            return response
        except web.HTTPNotFound:
            return _http_error(
                request,
                not_found(
                    f"no route {request.method} {request.path}; see GET /openapi.json for the "
                    "routes"
                ),
            )
        except web.HTTPException as exc:
            # aiohttp's own refusals (e.g. a bad Expect header): its status, as JSON.
            return _http_error(request, HttpError(exc.status, "INVALID_ARGUMENT", exc.reason))
        except Exception:
            # A bug in the door (the pipeline turns its own into INTERNAL): logged with its
            # traceback, answered without details, as the pipeline does.
            request_id = strings.echoed(request.headers.get(REQUEST_ID, "")) or new_request_id()
            log.exception("unexpected error", extra={"fields": {"request_id": request_id}})
            message = f"internal error in the gateway; quote request id {request_id}"
            return error_response(
                500, Kind.INTERNAL.code, message, request_id, wants_msgpack(request, False)
            )

    # --- predictions ------------------------------------------------------------------------

    async def predict(self, binding: Binding, request: web.Request) -> web.StreamResponse:
        match = request.match_info
        path_model = PathModel(match["model"], match.get("version"), match.get("label"))
        return await self._run(self._task_call(binding), request, f"POST :{binding.verb}",
                               path_model)  # fmt: skip

    async def invocations(self, request: web.Request) -> web.StreamResponse:
        """The default model with its task (SageMaker-style hosting), or the pipeline that
        `?pipeline=NAME` names."""
        if "pipeline" in request.query:
            return await self.run_pipeline(request, request.query["pipeline"], "/invocations")
        binding = self._bindings.for_task(self._pipeline.default_task())
        return await self._run(self._task_call(binding), request, "POST /invocations", None)

    async def pipeline(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/pipelines/{name}:run (gateway.core.cascade)."""
        return await self.run_pipeline(request, request.match_info["pipeline"], ":run")

    async def run_pipeline(self, request: web.Request, name: str, route: str) -> web.StreamResponse:
        def place(message: Any, _: object) -> None:
            if route == ":run" and message.pipeline and message.pipeline != name:
                raise errors.invalid_input(
                    f"the request names pipeline '{message.pipeline}' but the path names "
                    f"'{name}'; leave it out of the body or make them the same"
                )
            message.pipeline = name

        call = _Call(
            RunRequest, place, pipelines.check, pipelines.to_request,
            self._cascades.run_named, self._results.to_result,
        )  # fmt: skip
        return await self._run(call, request, f"POST {route}", True)

    def _task_call(self, binding: Binding) -> _Call:
        def check(message: Any) -> None:
            strings.request(message.request_id, message.model.name, message.model.label)

        def run(domain: Request) -> Awaitable[Outcome]:
            return self._pipeline.run(binding.task, domain)

        return _Call(
            binding.request_type, self._place_model, check, binding.to_request, run,
            binding.to_result,
        )  # fmt: skip

    async def expect(self, method: str, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: a body declared over the limit, or sent by a caller the
        gateway would refuse now (over its quota, or an identity it cannot take), is refused
        before the client sends it; otherwise aiohttp's own handling (100 Continue)."""
        started = time.perf_counter()
        body_format = bodies.body_kind(request.content_type.lower())
        length = request.content_length
        error: GatewayError | None = None
        if body_format is not None and length is not None:
            limit = bodies.body_limit(self._settings, body_format)
            if length > limit:
                error = bodies.too_large(length, limit)
        if error is None:
            try:
                self._pipeline.admits(self._caller(request))
            except GatewayError as exc:
                error = exc
        if error is None:
            await _default_expect_handler(request)
            return None
        as_msgpack = wants_msgpack(request, body_format == bodies.BodyFormat.MSGPACK)
        header_id = request.headers.get(REQUEST_ID, "")
        response = self._refused(method, error, header_id, started, as_msgpack)
        response.force_close()  # the body is not read
        return response

    async def _run(
        self, call: _Call, request: web.Request, method: str, path: PathModel | bool | None
    ) -> web.StreamResponse:
        """A prediction: `path` is what the route names (the model's path; True: a
        pipeline's; None: nothing, the body or the query may name the model)."""
        started = time.perf_counter()
        header_id = request.headers.get(REQUEST_ID, "")
        trace = tuple(
            (key.lower(), value)
            for key, value in request.headers.items()
            if key.lower() in TRACE_HEADERS
        )
        body_format = bodies.body_kind(request.content_type.lower())
        as_msgpack = wants_msgpack(request, body_format == bodies.BodyFormat.MSGPACK)
        try:
            # The caller's strings, identity and quota first: refused before the body is
            # read, so a caller over its quota costs no read and no parse.
            strings.trace(trace)
            caller = self._caller(request)
            self._pipeline.admits(caller)
            decoded = await self._request_message(call, request, body_format, path)
            message = decoded.message
            call.check(message)
        except (GatewayError, HttpError) as exc:
            response = self._refused(method, exc, header_id, started, as_msgpack)
            if response.status in (408, 413):
                response.force_close()  # the rest of the body is not read
            return response
        request_id = message.request_id or header_id or new_request_id()
        try:
            domain = call.to_request(message, request_id, method, None, trace)
            outcome = await call.run(domain._replace(caller=caller))
        except GatewayError as exc:
            status = STATUS[exc.kind]
            return error_response(
                status, exc.code, exc.message, request_id, as_msgpack, exc.retry_after
            )
        result = call.to_result(outcome)
        return await self.encoder.result_response(result, request_id, as_msgpack, decoded.metadata)

    async def _request_message(
        self,
        call: _Call,
        request: web.Request,
        body_format: str | None,
        path: PathModel | bool | None,
    ) -> bodies.Decoded:
        """The body read and decoded into the call's request message, with the query's
        options and the path's model (or pipeline) applied."""
        if body_format is None:
            raise unsupported_media_type(
                f"Content-Type {request.content_type or '(none)'} is not supported; send one "
                f"of {', '.join(bodies.ACCEPTED)}"
            )
        body = await bodies.read_body(request, body_format, self._settings)
        content_type = request.headers.get("Content-Type", "")
        decoded = await bodies.decode(
            body_format, content_type, body, call.message_type(), self._body_limits
        )
        message = decoded.message
        bodies.apply_query(message, request.query, allow_model=path is None)
        call.place(message, path)
        return decoded

    def _place_model(self, message: Any, path: PathModel | bool | None) -> None:
        if isinstance(path, PathModel):
            set_path_model(message, path.ref())
        elif not message.model.name:
            message.model.name = self._pipeline.default_model

    def _caller(self, request: web.Request) -> str:
        """Who is calling (gateway.identity, the same reader as every door)."""
        return identity.of_http(request, self._settings.trust_xfcc)

    def _refused(
        self,
        method: str,
        exc: GatewayError | HttpError,
        header_id: str,
        started: float,
        as_msgpack: bool,
    ) -> web.Response:
        """The answer to a request refused before the pipeline (its body unread, or read but
        not run): counted and logged here, like the pipeline does, under the caller's request
        id only when it is one the rule takes."""
        request_id = strings.echoed(header_id) or new_request_id()
        status = exc.status if isinstance(exc, HttpError) else STATUS[exc.kind]
        self._record_rejection(method, exc.code, request_id, started, status)
        retry = exc.retry_after if isinstance(exc, GatewayError) else None
        return error_response(status, exc.code, exc.message, request_id, as_msgpack, retry)

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

    # --- health, status, description, page --------------------------------------------------

    async def ping(self, request: web.Request) -> web.StreamResponse:
        if self._readiness.ready and not self.draining:
            return web.Response(body=b"{}", content_type=bodies.JSON)
        reason = (
            "the gateway is shutting down"
            if self.draining
            else f"model '{self._readiness.model}' is not AVAILABLE on TF Serving"
        )
        return error_response(503, Kind.UNAVAILABLE.code, reason, "", False)

    async def model_status(self, request: web.Request) -> web.StreamResponse:
        match = request.match_info
        as_msgpack = wants_msgpack(request, False)
        try:
            model = PathModel(match["model"], match.get("version"), match.get("label")).ref()
            status = await self._pipeline.model_status(model)
        except GatewayError as exc:
            return error_response(STATUS[exc.kind], exc.code, exc.message, "", as_msgpack)
        body = {
            "model_version_status": [
                _version_status(version) for version in status.model_version_status
            ]
        }
        return web.Response(
            body=json.dumps(body, separators=(",", ":")).encode(), content_type=bodies.JSON
        )

    async def rollout(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["model"]
        try:  # before anything about the model is told
            self._operators.check(self._caller(request), "rollout statistics")
        except GatewayError as exc:
            return error_response(STATUS[exc.kind], exc.code, exc.message, "", False)
        summary = self._pipeline.rollouts.summary(name)
        if summary is None:
            message = (
                f"model '{name}' has no rollout; give it one in the model config "
                f"([models.{name}.rollout], GATEWAY_MODEL_CONFIG)"
            )
            return error_response(STATUS[Kind.NOT_FOUND], Kind.NOT_FOUND.code, message, "", False)
        return web.Response(
            body=json.dumps(summary, separators=(",", ":")).encode(),
            content_type=bodies.JSON,
        )

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        document = openapi.document(self._pipeline.registry, self._bindings, self._jobs)
        return web.Response(body=json.dumps(document).encode(), content_type=bodies.JSON)

    async def page(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=page.render(
                self._pipeline.registry, self._bindings, self._jobs, self._cascades.cascades
            ).encode(),
            content_type="text/html",
            charset="utf-8",
            headers={
                # Everything the page needs is inline; nothing may load from elsewhere.
                "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                "style-src 'unsafe-inline'; img-src blob: data:; connect-src 'self' data:",
            },
        )


class _Call(NamedTuple):
    """What a prediction route runs: its request message, how the route's path goes into it
    (`place`), the message's own strings checked (`check`), the conversions and the run."""

    message_type: Callable[[], Any]
    place: Callable[[Any, PathModel | bool | None], None]
    check: Callable[[Any], None]
    to_request: ToRequest
    run: Callable[[Request], Awaitable[Outcome]]
    to_result: Callable[[Outcome], Any]


def _http_error(request: web.Request, error: HttpError) -> web.Response:
    request_id = strings.echoed(request.headers.get(REQUEST_ID, "")) or new_request_id()
    return error_response(
        error.status, error.code, error.message, request_id, wants_msgpack(request, False)
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
