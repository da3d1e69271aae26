"""GET /openapi.json: an OpenAPI 3.1 description of the HTTP door's routes.

Schemas are the proto3 JSON of the public API's messages (field names as in the .proto
files); a test checks that the paths and methods here are exactly the server's routes.
"""

from __future__ import annotations

from typing import Any

from gateway.frontends.http import codecs
from gateway.models import ModelRegistry

_ERROR = {
    "description": "error",
    "content": {
        codecs.JSON: {"schema": {"$ref": "#/components/schemas/Error"}},
        codecs.MSGPACK: {"schema": {"$ref": "#/components/schemas/Error"}},
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
_QUERY = {
    "detect": [
        ("min_score", "number", "minimum score, 0..1 (0: the model's default)"),
        ("max_detections", "integer", "most detections returned (0: the model's default)"),
    ],
    "classify": [
        ("top_k", "integer", "classes returned (0: the model's default)"),
        ("min_score", "number", "minimum score, 0..1 (0: the model's default)"),
    ],
}
_SCHEMAS = {
    "detect": ("DetectRequest", "DetectionResult"),
    "classify": ("ClassifyRequest", "ClassificationResult"),
}


def _request_body(verb: str) -> dict[str, Any]:
    request, _ = _SCHEMAS[verb]
    binary = {"type": "string", "format": "binary"}
    return {
        "required": True,
        "content": {
            codecs.JSON: {"schema": {"$ref": f"#/components/schemas/{request}"}},
            codecs.MSGPACK: {
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
            codecs.MULTIPART: {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {"image": binary},
                    "additionalProperties": {"type": "string"},
                }
            },
        },
    }


def _parameters(verb: str, names: tuple[str, ...], model_in_query: bool) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]
    options = [*_QUERY[verb], ("request_id", "string", "request id (else x-request-id)")]
    if model_in_query:
        options += [
            ("model", "string", "model name (default: the gateway's default model)"),
            ("version", "integer", "model version"),
            ("label", "string", "model version label"),
        ]
    params += [
        {"name": n, "in": "query", "required": False, "schema": {"type": t}, "description": d}
        for n, t, d in options
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
    verb: str, summary: str, names: tuple[str, ...], model_in_query: bool = False
) -> dict[str, Any]:
    _, result = _SCHEMAS[verb]
    responses: dict[str, Any] = {
        "200": {
            "description": "the result (every field present); MessagePack when Accept asks "
            "for it or the request was MessagePack",
            "content": {
                codecs.JSON: {"schema": {"$ref": f"#/components/schemas/{result}"}},
                codecs.MSGPACK: {"schema": {"$ref": f"#/components/schemas/{result}"}},
            },
        }
    }
    responses.update(
        {code: {**_ERROR, "description": text} for code, text in _PREDICT_ERRORS.items()}
    )
    return {
        "post": {
            "summary": summary,
            "parameters": _parameters(verb, names, model_in_query),
            "requestBody": _request_body(verb),
            "responses": responses,
        }
    }


def _status(names: tuple[str, ...]) -> dict[str, Any]:
    return {
        "get": {
            "summary": "TF Serving's status of the model's versions (as its REST API)",
            "parameters": [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                for n in names
            ],
            "responses": {
                "200": {
                    "description": "model_version_status",
                    "content": {
                        codecs.JSON: {"schema": {"$ref": "#/components/schemas/ModelStatus"}}
                    },
                },
                "404": {**_ERROR, "description": "unknown model or version"},
                "503": {**_ERROR, "description": "TF Serving unavailable"},
            },
        }
    }


def _schemas() -> dict[str, Any]:
    number, integer, string = {"type": "number"}, {"type": "integer"}, {"type": "string"}
    int64 = {"type": "string", "description": "int64 (a decimal string in proto3 JSON)"}
    model_spec = {
        "type": "object",
        "properties": {"name": string, "version": int64, "label": string},
        "description": "name, and version or label (not both)",
    }
    image = {
        "oneOf": [
            {"type": "string", "contentEncoding": "base64"},
            {"type": "object", "properties": {"b64": string}, "required": ["b64"]},
        ]
    }
    box = {
        "type": "object",
        "properties": {k: integer for k in ("x_min", "y_min", "x_max", "y_max")},
    }
    nbox = {
        "type": "object",
        "properties": {k: number for k in ("x_min", "y_min", "x_max", "y_max")},
    }
    served = {"type": "object", "properties": {"name": string, "version": int64}}
    common = {
        "image_width": integer,
        "image_height": integer,
        "model": served,
        "request_id": string,
    }
    return {
        "DetectRequest": {
            "type": "object",
            "required": ["image"],
            "properties": {
                "image": image,
                "min_score": number,
                "max_detections": integer,
                "model": model_spec,
                "request_id": string,
            },
        },
        "ClassifyRequest": {
            "type": "object",
            "required": ["image"],
            "properties": {
                "image": image,
                "top_k": integer,
                "min_score": number,
                "model": model_spec,
                "request_id": string,
            },
        },
        "DetectionResult": {
            "type": "object",
            "properties": {
                "detections": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "class_id": integer,
                            "label": string,
                            "score": number,
                            "box": box,
                            "normalized_box": nbox,
                        },
                    },
                },
                **common,
                "metadata": {"type": "object", "description": "a MessagePack request's metadata"},
            },
        },
        "ClassificationResult": {
            "type": "object",
            "properties": {
                "classes": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"class_id": integer, "label": string, "score": number},
                    },
                },
                **common,
                "metadata": {"type": "object", "description": "a MessagePack request's metadata"},
            },
        },
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


def document(registry: ModelRegistry) -> dict[str, Any]:
    models = ", ".join(sorted({registry.default_model, *registry.models})) or "none configured"
    invocations_task = "detect"
    default = registry.models.get(registry.default_model)
    if default is not None and default.task == "classification":
        invocations_task = "classify"
    paths: dict[str, Any] = {}
    for verb, what in (("detect", "Detect objects"), ("classify", "Classify")):
        base = "/v1/models/{model}"
        paths[f"{base}:{verb}"] = _predict(verb, f"{what} (latest version)", ("model",))
        paths[f"{base}/versions/{{version}}:{verb}"] = _predict(
            verb, f"{what} with a model version", ("model", "version")
        )
        paths[f"{base}/labels/{{label}}:{verb}"] = _predict(
            verb, f"{what} with a version label", ("model", "label")
        )
    paths["/invocations"] = _predict(
        invocations_task,
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
                    "content": {codecs.JSON: {"schema": {"type": "object"}}},
                },
                "503": {**_ERROR, "description": "not ready, or shutting down"},
            },
        }
    }
    paths["/v1/models/{model}"] = _status(("model",))
    paths["/v1/models/{model}/versions/{version}"] = _status(("model", "version"))
    paths["/v1/models/{model}/labels/{label}"] = _status(("model", "label"))
    paths["/openapi.json"] = {
        "get": {"summary": "this description", "responses": {"200": {"description": "OpenAPI 3.1"}}}
    }
    paths["/"] = {
        "get": {
            "summary": "a page to try the API: pick an image and a model, see the result drawn",
            "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Vision gateway HTTP API",
            "version": "1",
            "description": "Detection and classification in front of TensorFlow Serving; the "
            f"same core as the gRPC API (detection.v1, classification.v1). Models: {models}.",
        },
        "paths": paths,
        "components": {"schemas": _schemas()},
    }
