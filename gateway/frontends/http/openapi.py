"""GET /openapi.json: an OpenAPI 3.1 description of the HTTP door's routes.

The prediction routes come from the bindings (gateway.api.bindings); their schemas are the
proto3 JSON of the bindings' messages, read from the messages' descriptors (field names as in
the .proto files). A test checks that the paths and methods here are exactly the server's
routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from google.protobuf.descriptor import FieldDescriptor

from gateway.api.bindings import Bindings
from gateway.frontends.http import bodies, jobs_openapi
from gateway.models import ModelRegistry
from gateway.proto.pipeline.v1 import pipeline_pb2 as ppb

Field = FieldDescriptor


class Described(Protocol):
    """What a prediction route is described from: a binding, or the pipelines' route."""

    @property
    def request_type(self) -> Any: ...

    @property
    def result_type(self) -> Any: ...

    @property
    def options(self) -> Mapping[str, str]: ...


class _Route(NamedTuple):
    request_type: Any
    result_type: Any
    options: Mapping[str, str]


_PIPELINES = _Route(
    ppb.RunRequest,
    ppb.PipelineResult,
    {
        "min_score": "the first model's minimum score, 0..1 (0: the pipeline's default)",
        "max_detections": "the first model's most instances (0: the pipeline's default)",
    },
)

_ERROR = {
    "description": "error",
    "content": {
        bodies.JSON: {"schema": {"$ref": "#/components/schemas/Error"}},
        bodies.MSGPACK: {"schema": {"$ref": "#/components/schemas/Error"}},
    },
}
# Statuses every prediction route can answer besides 200 (gateway/frontends/http/status.py).
_PREDICT_ERRORS = {
    "400": "invalid request (names the field), or a model that cannot serve this task",
    "404": "unknown model, version or label",
    "408": "the body did not arrive within GATEWAY_HTTP_BODY_TIMEOUT",
    "413": "body or image over the limits (GATEWAY_MAX_IMAGE_BYTES, GATEWAY_MAX_PIXELS)",
    "415": "unsupported Content-Type",
    "429": "the gateway is at GATEWAY_MAX_CONCURRENT_REQUESTS, or TF Serving is full",
    "499": "cancelled (the caller hung up, or the gateway is stopping)",
    "500": "internal error (quote the request id)",
    "503": "TF Serving unavailable",
    "504": "TF Serving did not answer in time",
}


def _request_body(binding: Described) -> dict[str, Any]:
    request = binding.request_type.DESCRIPTOR.name
    binary = {"type": "string", "format": "binary"}
    return {
        "required": True,
        "content": {
            bodies.JSON: {"schema": {"$ref": f"#/components/schemas/{request}"}},
            bodies.MSGPACK: {
                "schema": {
                    "type": "object",
                    "description": f"{request} fields under their proto names with image as "
                    "bin; every other key is metadata, returned unchanged under 'metadata'",
                    "required": ["image"],
                    "additionalProperties": True,
                }
            },
            "application/msgpack": {"schema": {"type": "object", "required": ["image"]}},
            "image/*": {"schema": binary},
            "application/x-image": {"schema": binary},
            "application/octet-stream": {"schema": binary},
            bodies.MULTIPART: {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {"image": binary},
                    "additionalProperties": {"type": "string"},
                }
            },
        },
    }


def _parameters(
    binding: Described, names: tuple[str, ...], model_in_query: bool
) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in names
    ]
    fields = binding.request_type.DESCRIPTOR.fields_by_name
    options = [
        (name, _scalar(fields[name])["type"], text) for name, text in binding.options.items()
    ]
    options.append(("request_id", "string", "request id (else x-request-id)"))
    if model_in_query:
        options += [
            ("model", "string", "model name (default: the gateway's default model)"),
            ("version", "integer", "model version"),
            ("label", "string", "model version label"),
            ("pipeline", "string", "a pipeline to run instead ([pipelines.NAME])"),
        ]
    params += [
        {
            "name": name,
            "in": "query",
            "required": False,
            "schema": {"type": kind},
            "description": text,
        }
        for name, kind, text in options
    ]
    params.append(
        {
            "name": "x-request-id",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "request id; the response always carries one",
        }
    )
    return params


def _predict(
    binding: Described, summary: str, names: tuple[str, ...], model_in_query: bool = False
) -> dict[str, Any]:
    result = binding.result_type.DESCRIPTOR.name
    responses: dict[str, Any] = {
        "200": {
            "description": "the result (every field present); MessagePack when Accept asks "
            "for it or the request was MessagePack",
            "content": {
                bodies.JSON: {"schema": {"$ref": f"#/components/schemas/{result}"}},
                bodies.MSGPACK: {"schema": {"$ref": f"#/components/schemas/{result}"}},
            },
        }
    }
    responses.update(
        {code: {**_ERROR, "description": text} for code, text in _PREDICT_ERRORS.items()}
    )
    return {
        "post": {
            "summary": summary,
            "parameters": _parameters(binding, names, model_in_query),
            "requestBody": _request_body(binding),
            "responses": responses,
        }
    }


def _status(names: tuple[str, ...]) -> dict[str, Any]:
    return {
        "get": {
            "summary": "TF Serving's status of the model's versions (as its REST API)",
            "parameters": [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in names
            ],
            "responses": {
                "200": {
                    "description": "model_version_status",
                    "content": {
                        bodies.JSON: {"schema": {"$ref": "#/components/schemas/ModelStatus"}}
                    },
                },
                "404": {**_ERROR, "description": "unknown model or version"},
                "503": {**_ERROR, "description": "TF Serving unavailable"},
            },
        }
    }


def _scalar(field: Any) -> dict[str, Any]:
    """The proto3 JSON schema of a scalar field."""
    if field.type in (Field.TYPE_INT64, Field.TYPE_UINT64, Field.TYPE_SINT64, Field.TYPE_FIXED64,
                      Field.TYPE_SFIXED64):  # fmt: skip
        return {"type": "string", "description": "int64 (a decimal string in proto3 JSON)"}
    if field.type in (Field.TYPE_FLOAT, Field.TYPE_DOUBLE):
        return {"type": "number"}
    if field.type == Field.TYPE_BOOL:
        return {"type": "boolean"}
    if field.type == Field.TYPE_BYTES:
        return {"type": "string", "contentEncoding": "base64"}
    if field.type in (Field.TYPE_STRING, Field.TYPE_ENUM):
        return {"type": "string"}
    return {"type": "integer"}


# The request's image: base64, or TF Serving REST's {"b64": ...}.
_IMAGE: dict[str, Any] = {
    "oneOf": [
        {"type": "string", "contentEncoding": "base64"},
        {"type": "object", "properties": {"b64": {"type": "string"}}, "required": ["b64"]},
    ]
}
_DESCRIPTIONS = {
    "ModelSpec": "name, and version or label (not both)",
    "Status": "a stream's per-image error (google.rpc.Status; codes as gRPC's)",
}


def _add_schema(descriptor: Any, schemas: dict[str, Any]) -> str:
    """Adds the schema of `descriptor` (and of the messages it holds) to `schemas`; returns
    its name there."""
    name = descriptor.name
    if name in schemas:
        return name
    if descriptor.full_name == "google.protobuf.Any":
        schemas[name] = {"type": "object", "properties": {"@type": {"type": "string"}}}
        return name
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    schemas[name] = schema
    for field in descriptor.fields:
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:  # a map: a JSON object
            item = entry.fields_by_name["value"]
            value = (
                {"$ref": f"#/components/schemas/{_add_schema(item.message_type, schemas)}"}
                if item.type == Field.TYPE_MESSAGE
                else _scalar(item)
            )
            schema["properties"][field.name] = {"type": "object", "additionalProperties": value}
            continue
        if field.type == Field.TYPE_MESSAGE:
            value = {"$ref": f"#/components/schemas/{_add_schema(field.message_type, schemas)}"}
        elif field.name == "image" and field.type == Field.TYPE_BYTES:
            value = _IMAGE
        else:
            value = _scalar(field)
        schema["properties"][field.name] = (
            {"type": "array", "items": value} if field.is_repeated else value
        )
    if name in _DESCRIPTIONS:
        schema["description"] = _DESCRIPTIONS[name]
    return name


def _schemas(bindings: Bindings, jobs: bool) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for descriptor in jobs_openapi.MESSAGES if jobs else ():
        _add_schema(descriptor, schemas)
    for binding in (*bindings, _PIPELINES):
        request = schemas[_add_schema(binding.request_type.DESCRIPTOR, schemas)]
        request["required"] = ["image"]
        result = schemas[_add_schema(binding.result_type.DESCRIPTOR, schemas)]
        result["properties"]["metadata"] = {
            "type": "object",
            "description": "a MessagePack request's metadata",
        }
    if jobs:
        jobs_openapi.describe_create(schemas, bindings)
    string = {"type": "string"}
    return {
        **schemas,
        "ModelStatus": {
            "type": "object",
            "properties": {
                "model_version_status": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "version": string,
                            "state": string,
                            "status": {
                                "type": "object",
                                "properties": {"error_code": string, "error_message": string},
                            },
                        },
                    },
                }
            },
        },
        "Error": {
            "type": "object",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "canonical status name"},
                        "message": string,
                    },
                }
            },
        },
    }


def document(registry: ModelRegistry, bindings: Bindings, jobs: bool = False) -> dict[str, Any]:
    """The description; `jobs`: with the batch jobs routes."""
    models = ", ".join(sorted({registry.default_model, *registry.models})) or "none configured"
    paths: dict[str, Any] = {}
    for binding in bindings:
        verb, what = binding.verb, binding.summary
        base = "/v1/models/{model}"
        paths[f"{base}:{verb}"] = _predict(binding, f"{what} (latest version)", ("model",))
        paths[f"{base}/versions/{{version}}:{verb}"] = _predict(
            binding, f"{what} with a model version", ("model", "version")
        )
        paths[f"{base}/labels/{{label}}:{verb}"] = _predict(
            binding, f"{what} with a version label", ("model", "label")
        )
    pipelines = ", ".join(registry.pipelines) or "none configured"
    paths["/v1/pipelines/{pipeline}:run"] = _predict(
        _PIPELINES,
        f"Run a pipeline: detect, then a model on each instance's crop (configured: {pipelines})",
        ("pipeline",),
    )
    paths["/invocations"] = _predict(
        bindings.for_task(registry.task_of(registry.default_model)),
        f"SageMaker-style: the default model '{registry.default_model}' and its task",
        (),
        model_in_query=True,
    )
    paths["/ping"] = {
        "get": {
            "summary": "readiness: 200 {} while the default model is AVAILABLE on TF Serving",
            "responses": {
                "200": {
                    "description": "ready",
                    "content": {bodies.JSON: {"schema": {"type": "object"}}},
                },
                "503": {**_ERROR, "description": "not ready, or shutting down"},
            },
        }
    }
    paths["/v1/models/{model}"] = _status(("model",))
    paths["/v1/models/{model}/versions/{version}"] = _status(("model", "version"))
    paths["/v1/models/{model}/labels/{label}"] = _status(("model", "label"))
    paths["/v1/models/{model}/rollout"] = {
        "get": {
            "summary": "the model's rollout ([models.NAME.rollout]): its canary and shadow, "
            "requests per side, shadow calls and how the shadow's answers compared (counts of "
            "the gateway process that answers); for the operators' identities",
            "parameters": [
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {
                    "description": "the rollout summary",
                    "content": {bodies.JSON: {"schema": {"type": "object"}}},
                },
                "403": {
                    **_ERROR,
                    "description": "the caller is not an operator (GATEWAY_OPERATOR_IDENTITIES)",
                },
                "404": {**_ERROR, "description": "the model config gives the model no rollout"},
            },
        }
    }
    paths["/openapi.json"] = {
        "get": {"summary": "this description", "responses": {"200": {"description": "OpenAPI 3.1"}}}
    }
    paths["/"] = {
        "get": {
            "summary": "a page to try the API: pick an image and a model, see the result drawn",
            "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}},
        }
    }
    if jobs:
        paths.update(jobs_openapi.openapi_paths(_ERROR))
    tasks = ", ".join(binding.task for binding in bindings).capitalize()
    services = ", ".join(binding.service_name for binding in bindings)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Vision gateway HTTP API",
            "version": "1",
            "description": f"{tasks} in front of TensorFlow Serving; the same core as the "
            f"gRPC API ({services}). Models: {models}.",
        },
        "paths": paths,
        "components": {"schemas": _schemas(bindings, jobs)},
    }
