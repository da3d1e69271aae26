"""The gateway's HTTP door from Python, with urllib: the raw image as the body, options in
the query, the proto3 JSON result parsed back into the same messages as the gRPC stubs
return (a task's result, or a pipeline's PipelineResult)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from google.protobuf import json_format

from gateway.api.bindings import Bindings
from gateway.api.pipelines import OPTIONS
from gateway.client.pipelines import pipeline_request
from gateway.proto.pipeline.v1 import pipeline_pb2 as pb
from gateway.tasks.builtin import BUILT_IN


class HttpClient:
    """The gateway's HTTP door with urllib: the raw image as the body, options in the query,
    the proto3 JSON result parsed back into the same messages as the gRPC clients return.
    `task` is a verb of `bindings` (the tasks the gateway serves; default: the built-in ones)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        task: str = "detect",
        bindings: Bindings = BUILT_IN,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.task = task
        try:
            self._binding = bindings.for_verb(task)
        except KeyError:
            raise ValueError(
                f"task must be one of {', '.join(bindings.verbs)}, got {task!r}"
            ) from None

    def path(self, model: str, version: int | None, label: str | None) -> str:
        """The route: /v1/models/{model}[/versions/{n}|/labels/{l}]:{task}, or /invocations
        (the gateway's default model and its task) when no model is named."""
        if not model:
            if version is not None or label is not None:
                raise ValueError("--version and --label need --model over HTTP")
            return "/invocations"
        path = "/v1/models/" + urllib.parse.quote(model, safe="")
        if version is not None:
            path += f"/versions/{version}"
        elif label is not None:
            path += "/labels/" + urllib.parse.quote(label, safe="")
        return f"{path}:{self.task}"

    def call(
        self,
        image: bytes,
        *,
        model: str = "",
        version: int | None = None,
        label: str | None = None,
        **options: Any,
    ) -> Any:
        """One image; raises HttpCallError with the gateway's error code and message."""
        body = self._post(self.path(model, version, label), image, options)
        return json_format.Parse(body, self._binding.result_type(), ignore_unknown_fields=True)

    def run_pipeline(
        self, image: bytes, pipeline: str, *, request_id: str = "", **options: Any
    ) -> pb.PipelineResult:
        """One image through the gateway's pipeline `pipeline` (POST
        /v1/pipelines/{name}:run; options: the first model's min_score and max_detections);
        its pipeline.v1 PipelineResult. HttpCallError as call()."""
        message = pipeline_request(image, pipeline, request_id=request_id, **options)
        fields = {name: getattr(message, name) for name in (*OPTIONS, "request_id")}
        path = "/v1/pipelines/" + urllib.parse.quote(pipeline, safe="") + ":run"
        body = self._post(path, image, fields)
        return json_format.Parse(body, pb.PipelineResult(), ignore_unknown_fields=True)

    def _post(self, path: str, image: bytes, options: dict[str, Any]) -> bytes:
        """The raw image to `path` with the options set (not 0 or empty) in the query; the
        answer's body."""
        query = urllib.parse.urlencode({name: value for name, value in options.items() if value})
        request = urllib.request.Request(
            self.url + path + (f"?{query}" if query else ""),
            data=image,
            headers={"Content-Type": "application/octet-stream", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            raise HttpCallError.from_response(exc.code, exc.read()) from None


class HttpCallError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def from_response(cls, status: int, body: bytes) -> HttpCallError:
        try:
            error = json.loads(body)["error"]
            return cls(status, str(error["code"]), str(error["message"]))
        except (ValueError, KeyError, TypeError):
            return cls(status, "UNKNOWN", f"HTTP {status}: {body[:200]!r}")
