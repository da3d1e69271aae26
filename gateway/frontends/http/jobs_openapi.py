"""The OpenAPI description of the batch jobs routes (gateway.frontends.http.job_handlers);
gateway.frontends.http.openapi adds it to /openapi.json."""

from __future__ import annotations

from typing import Any

from google.longrunning import operations_pb2 as lro

from gateway.api.bindings import Bindings
from gateway.frontends.http import bodies
from gateway.frontends.http.job_handlers import MAX_WAIT_SECONDS, NDJSON, UPLOAD_ID_FIELD
from gateway.proto.vision.v1 import batch_pb2 as bpb

# Messages the jobs routes send and receive, for the document's schemas.
MESSAGES = (
    bpb.CreateBatchJobRequest.DESCRIPTOR,
    bpb.UploadImagesResponse.DESCRIPTOR,
    bpb.BatchJobMetadata.DESCRIPTOR,
    bpb.BatchJobResult.DESCRIPTOR,
    bpb.BatchResultLine.DESCRIPTOR,
    lro.Operation.DESCRIPTOR,
    lro.ListOperationsResponse.DESCRIPTOR,
)
_JOB_ERRORS = {
    "400": "invalid request (names the field), or an input the gateway cannot read",
    "403": "an input or output outside the allowed prefixes",
    "404": "no such operation or upload for this caller (others' do not exist for you)",
    "409": "a request_id reused with other fields",
    "429": "too many jobs or uploads, or the job store is full",
}


def describe_create(schemas: dict[str, Any], bindings: Bindings) -> None:
    """CreateBatchJobRequest's `task` as the verbs served and its `options` as each task's
    option fields (a plain object) or an Any holding the task's request message; the tasks'
    request schemas must be in `schemas` already."""
    fields = schemas["CreateBatchJobRequest"]["properties"]
    verbs = [binding.verb for binding in bindings]
    fields["task"] = {
        "type": "string",
        "enum": ["", *verbs],
        "description": f"the task's verb; empty: {verbs[0] if verbs else 'none'}",
    }
    variants: list[dict[str, Any]] = []
    for binding in bindings:
        request = schemas[binding.request_type.DESCRIPTOR.name]["properties"]
        variants.append(
            {
                "type": "object",
                "description": f"task {binding.verb}: fields of "
                f"{binding.request_type.DESCRIPTOR.full_name} (a field it lacks is refused)",
                "properties": {name: request[name] for name in binding.options},
                "additionalProperties": False,
            }
        )
    variants.append({"$ref": "#/components/schemas/Any"})
    fields["options"] = {
        "anyOf": variants,
        "description": "the task's options: a plain object of its option fields, or the "
        "proto3 JSON of an Any holding its request message (only options set)",
    }


def _ref(name: str) -> dict[str, Any]:
    return {"schema": {"$ref": f"#/components/schemas/{name}"}}


def _operation_id() -> dict[str, Any]:
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "the part after `operations/` of the Operation's name",
    }


def _route(
    summary: str,
    answer: str,
    error: dict[str, Any],
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    media: str = bodies.JSON,
) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": answer, "content": {media: _ref(answer) if answer else {}}}
    }
    responses.update({code: {**error, "description": text} for code, text in _JOB_ERRORS.items()})
    route: dict[str, Any] = {"summary": summary, "responses": responses}
    if parameters:
        route["parameters"] = parameters
    if body:
        route["requestBody"] = body
    return route


def _query(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": description,
    }


def openapi_paths(error: dict[str, Any]) -> dict[str, Any]:
    """The jobs routes' paths; `error` is the door's error response object."""
    binary = {"type": "string", "format": "binary"}
    upload_form = {
        "type": "object",
        "required": ["image"],
        "properties": {
            UPLOAD_ID_FIELD: {
                "type": "string",
                "description": "add to this upload (a part before the images)",
            },
            "image": {"type": "array", "items": binary},
        },
    }
    operation = [_operation_id()]
    return {
        "/v1/uploads": {
            "post": _route(
                "stores images for a batch job (UploadImages): one `image` part each",
                "UploadImagesResponse",
                error,
                body={"required": True, "content": {bodies.MULTIPART: {"schema": upload_form}}},
            )
        },
        "/v1/batchJobs": {
            "post": _route(
                "starts a batch job (CreateBatchJob); metadata: BatchJobMetadata, response: "
                "BatchJobResult",
                "Operation",
                error,
                body={"required": True, "content": {bodies.JSON: _ref("CreateBatchJobRequest")}},
            )
        },
        "/v1/operations": {
            "get": _route(
                "the caller's operations (ListOperations), newest last",
                "ListOperationsResponse",
                error,
                parameters=[
                    _query("filter", "e.g. state=RUNNING, state=SUCCEEDED OR state=FAILED"),
                    _query("page_size", "operations per page (0: the default)"),
                    _query("page_token", "next_page_token of the previous page"),
                ],
            )
        },
        "/v1/operations/{id}": {
            "get": _route("an operation (GetOperation)", "Operation", error, parameters=operation),
            "delete": _route(
                "stops the job if it runs and forgets it (DeleteOperation)",
                "",
                error,
                parameters=operation,
            ),
        },
        "/v1/operations/{id}:cancel": {
            "post": _route(
                "stops the job; lines finished stay readable (CancelOperation)",
                "",
                error,
                parameters=operation,
            )
        },
        "/v1/operations/{id}:wait": {
            "post": _route(
                f"the operation once done, or after `timeout` (at most {MAX_WAIT_SECONDS:g} s) "
                "with done false (WaitOperation)",
                "Operation",
                error,
                parameters=[
                    *operation,
                    _query("timeout", f"a duration such as 30s (default {MAX_WAIT_SECONDS:g}s)"),
                ],
            )
        },
        "/v1/operations/{id}/results": {
            "get": _route(
                "the result lines in input order, one JSON object (BatchResultLine) per line, "
                'streamed; a failure mid-stream ends it with one {"error": ...} line',
                "BatchResultLine",
                error,
                parameters=[
                    *operation,
                    _query("page_token", "a line's page_token: resume after that line"),
                ],
                media=NDJSON,
            )
        },
    }
