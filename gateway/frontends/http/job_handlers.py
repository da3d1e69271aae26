"""Batch jobs over HTTP: the jobs service (gateway.jobs.control.service) behind the routes of
gateway.frontends.http.routes, converted as the gRPC door converts them
(gateway.jobs.spec.conversions), for callers that speak only HTTP.

    POST   /v1/uploads                    multipart: `image` parts (and `upload_id` first, to
                                          add to an upload) -> UploadImagesResponse
    POST   /v1/batchJobs                  the proto3 JSON of CreateBatchJobRequest -> Operation
                                          (`options`: the task's options as a plain object)
    GET    /v1/operations                 ?filter=&page_size=&page_token= -> ListOperationsResponse
    GET    /v1/operations/{id}            -> Operation
    POST   /v1/operations/{id}:cancel     -> {}
    POST   /v1/operations/{id}:wait       ?timeout=60s -> Operation (done or not)
    DELETE /v1/operations/{id}            -> {}
    GET    /v1/operations/{id}/results    ?page_token= -> the result lines, application/x-ndjson

JSON as the rest of the door writes it: proto field names, every field (int64 as strings),
errors `{"error": {"code", "message"}}` with the door's statuses. The caller is who the
gateway.identity rules say (client certificate, or x-forwarded-client-cert when trusted), so
every route sees exactly the operations gRPC shows the same caller.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, web
from google.longrunning import operations_pb2 as lro
from google.protobuf import duration_pb2
from google.protobuf.message import Message

from gateway import errors, identity
from gateway.api.protojson import to_dict
from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.frontends.http import bodies
from gateway.frontends.http.responses import error_response
from gateway.frontends.http.status import STATUS, HttpError, body_timeout, unsupported_media_type
from gateway.jobs.control.service import JobService
from gateway.jobs.spec.conversions import (
    from_json,
    to_line,
    to_operation,
    to_request,
    upload_timeout,
)
from gateway.proto.vision.v1 import batch_pb2 as bpb

NDJSON = "application/x-ndjson"
# A CreateBatchJobRequest is a few hundred bytes; this leaves room for long URIs.
MAX_CREATE_BYTES = 64 * 1024
# The longest one :wait holds the connection: load balancers commonly close connections
# idle for 60 s. A longer `timeout` waits this long and answers `done: false`: wait again.
MAX_WAIT_SECONDS = 60.0
# Result lines are written in chunks of about this size (fewer writes, still streamed).
WRITE_CHUNK = 64 * 1024
# What a multipart part may be called besides `image`, and its longest value.
UPLOAD_ID_FIELD = "upload_id"
MAX_FIELD_BYTES = 256
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

Method = Callable[[Any, web.Request], Awaitable[web.StreamResponse]]


def _json(message: Message) -> dict[str, Any]:
    return to_dict(message)


def _answer(message: Message) -> web.Response:
    return web.Response(
        body=json.dumps(_json(message), separators=(",", ":")).encode(), content_type=bodies.JSON
    )


def _failure(status: int, code: str, message: str) -> web.Response:
    return error_response(status, code, message, "", as_msgpack=False)


def answers_errors(handler: Method) -> Method:
    """The handler's GatewayError and HttpError as the door's error answers."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: web.Request) -> web.StreamResponse:
        try:
            return await handler(self, request)
        except GatewayError as e:
            return _failure(STATUS[e.kind], e.code, e.message)
        except HttpError as e:
            return _failure(e.status, e.code, e.message)

    return wrapped


def file_name(given: str | None) -> str:
    """A browser's file name as an upload's image name: kept when it is letters, digits,
    '.', '-' and '_'; any other character becomes '_' (an image's name orders the upload and
    is its result line's id). No name: the service numbers it."""
    if not given:
        return ""
    name = _UNSAFE.sub("_", given.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]).lstrip("._-")
    return name[:200]


def _duration(text: str) -> float:
    duration = duration_pb2.Duration()
    try:
        duration.FromJsonString(text)
    except ValueError:
        raise errors.invalid_input(
            f"timeout={text!r} is not a duration; write seconds with an s, e.g. 30s or 2.5s"
        ) from None
    seconds = duration.ToTimedelta().total_seconds()
    if seconds < 0:
        raise errors.invalid_input(f"timeout={text!r} is negative")
    return min(seconds, MAX_WAIT_SECONDS)


def create_too_large() -> GatewayError:
    return GatewayError(
        Kind.TOO_LARGE,
        f"the request body is over {MAX_CREATE_BYTES} bytes: a CreateBatchJobRequest names its "
        "images (input_uri or upload_id), it does not carry them; send images with "
        "POST /v1/uploads",
    )


class JobHandlers:
    """The jobs routes' handlers over one jobs service."""

    def __init__(self, settings: Settings, jobs: JobService) -> None:
        self._settings = settings
        self._jobs = jobs

    def caller(self, request: web.Request) -> str:
        found = identity.of_http(request, self._settings.trust_xfcc)
        return identity.for_jobs(found, self._settings.batch_allow_anonymous)

    @staticmethod
    def operation_name(request: web.Request) -> str:
        return f"operations/{request.match_info['id']}"

    # --- uploads and new jobs ---------------------------------------------------------------

    @answers_errors
    async def upload(self, request: web.Request) -> web.StreamResponse:
        if request.content_type.lower() != bodies.MULTIPART:
            raise unsupported_media_type(
                f"POST /v1/uploads takes {bodies.MULTIPART} with one `image` part per image, "
                f"not {request.content_type or 'no Content-Type'}"
            )
        caller = self.caller(request)
        reader = await request.multipart()
        limit = self._settings.batch_upload_timeout
        try:
            async with asyncio.timeout(limit):
                upload_id, count, size = await self._jobs.upload(caller, self._parts(reader))
        except TimeoutError:
            raise body_timeout(upload_timeout(limit)) from None
        return _answer(
            bpb.UploadImagesResponse(upload_id=upload_id, image_count=count, total_bytes=size)
        )

    async def _parts(self, reader: Any) -> AsyncIterator[tuple[str, str, bytes]]:
        """(upload id, name, bytes) per `image` part, read one at a time within the image
        limit and the body timeout; an `upload_id` part must come before the images."""
        upload_id = ""
        seen_image = False
        while True:
            part = await self._within_timeout(reader.next())
            if part is None:
                return
            if not isinstance(part, BodyPartReader):
                raise errors.invalid_input("nested multipart bodies are not accepted")
            if part.name == UPLOAD_ID_FIELD:
                if seen_image:
                    raise errors.invalid_input(
                        "the upload_id part must come before the image parts"
                    )
                upload_id = (await self._read(part, MAX_FIELD_BYTES, "upload_id")).decode(
                    errors="replace"
                )
                continue
            if part.name != "image":
                raise errors.invalid_input(
                    f"unknown form field {part.name!r}: send each image as a part named "
                    "`image` (and optionally `upload_id` first, to add to an upload)"
                )
            seen_image = True
            data = await self._read(part, self._settings.max_image_bytes, "image")
            yield upload_id, file_name(part.filename), data

    async def _read(self, part: BodyPartReader, limit: int, what: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await self._within_timeout(part.read_chunk(256 * 1024))
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                if what == "image":
                    raise GatewayError(
                        errors.Kind.TOO_LARGE,
                        f"image {part.filename or ''!r} is more than {limit} bytes "
                        "(GATEWAY_MAX_IMAGE_BYTES)",
                    )
                raise errors.invalid_input(f"the {what} field is longer than {limit} bytes")
            chunks.append(chunk)

    async def _within_timeout(self, step: Awaitable[Any]) -> Any:
        timeout = self._settings.http_body_timeout
        try:
            async with asyncio.timeout(timeout):
                return await step
        except TimeoutError:
            raise body_timeout(
                f"an upload's part did not arrive within {timeout:g} s; "
                "GATEWAY_HTTP_BODY_TIMEOUT sets the limit"
            ) from None

    @answers_errors
    async def create(self, request: web.Request) -> web.StreamResponse:
        if request.content_type.lower() != bodies.JSON:
            raise unsupported_media_type(
                "POST /v1/batchJobs takes application/json: the proto3 JSON of "
                "vision.v1.CreateBatchJobRequest (its options may be a plain object)"
            )
        body = await bodies.read_bounded(
            request,
            MAX_CREATE_BYTES,
            self._settings.http_body_timeout,
            lambda size, streamed: create_too_large(),
        )
        message = from_json(body, self._jobs.bindings)
        job = await self._jobs.create(
            self.caller(request), to_request(message, self._jobs.bindings)
        )
        return _answer(to_operation(await self._jobs.current(job)))

    # --- operations -------------------------------------------------------------------------

    @answers_errors
    async def get(self, request: web.Request) -> web.StreamResponse:
        view = await self._jobs.get(self.caller(request), self.operation_name(request))
        return _answer(to_operation(view))

    @answers_errors
    async def list_operations(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        size = query.get("page_size", "0") or "0"
        try:
            page_size = int(size)
        except ValueError:
            raise errors.invalid_input(f"page_size={size!r} is not an integer") from None
        views, token = await self._jobs.list(
            self.caller(request), query.get("filter", ""), page_size, query.get("page_token", "")
        )
        return _answer(
            lro.ListOperationsResponse(
                operations=[to_operation(v) for v in views], next_page_token=token
            )
        )

    @answers_errors
    async def cancel(self, request: web.Request) -> web.StreamResponse:
        await self._jobs.cancel(self.caller(request), self.operation_name(request))
        return web.json_response({})

    @answers_errors
    async def wait(self, request: web.Request) -> web.StreamResponse:
        timeout = _duration(request.query.get("timeout", f"{MAX_WAIT_SECONDS:g}s"))
        view = await self._jobs.wait(self.caller(request), self.operation_name(request), timeout)
        return _answer(to_operation(view))

    @answers_errors
    async def delete(self, request: web.Request) -> web.StreamResponse:
        await self._jobs.delete(self.caller(request), self.operation_name(request))
        return web.json_response({})

    @answers_errors
    async def results(self, request: web.Request) -> web.StreamResponse:
        """The result lines in input order, one JSON object per line, streamed as they are
        read; each carries the `page_token` that resumes after it. A failure after the first
        line ends the stream with one `{"error": ...}` line."""
        lines = self._jobs.read(
            self.caller(request), self.operation_name(request), request.query.get("page_token", "")
        ).__aiter__()
        # Unknown operations and bad tokens fail before the first line: an ordinary answer.
        first = await anext(lines, None)
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        pending: list[bytes] = []
        size = 0
        item = first
        try:
            while item is not None:
                result_type, file, index, line, after = item
                text = json.dumps(
                    _json(to_line(result_type, file, index, line, after)), separators=(",", ":")
                )
                pending.append(text.encode() + b"\n")
                size += len(pending[-1])
                if size >= WRITE_CHUNK:
                    await response.write(b"".join(pending))
                    pending, size = [], 0
                item = await anext(lines, None)
        except GatewayError as e:
            error = {"error": {"code": e.code, "message": e.message}}
            pending.append(json.dumps(error).encode() + b"\n")
        if pending:
            await response.write(b"".join(pending))
        await response.write_eof()
        return response
