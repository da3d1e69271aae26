"""Stubs for a task's service, made from its binding: blocking clients for scripts and the
command line, asyncio stubs for the batch runner."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from types import TracebackType
from typing import Any

from gateway.api.bindings import Binding, Bindings
from gateway.api.channel import DEFAULT_MAX_MESSAGE_BYTES, open_channel, task_methods
from gateway.client.messages import task_request
from gateway.client.pipelines import pipeline_request
from gateway.proto.pipeline.v1 import pipeline_pb2_grpc as ppb_grpc
from gateway.tasks.builtin import BUILT_IN
from gateway.tls import TLS


class _Channel:
    """One channel to the gateway, reused for every call; closed by close() or `with`."""

    def __init__(
        self,
        target: str,
        timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: TLS | None = None,
    ) -> None:
        self.timeout = timeout
        self._channel = open_channel(target, tls, max_message_bytes)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class GatewayClient(_Channel):
    """Blocking client of every task the gateway serves, on one channel:
    `client.call(verb, image, **fields)` and `client.stream(verb, images, **fields)`, or by
    the task's verb: `client.detect(image, min_score=0.4)`, `client.segment(image)`,
    `client.classify_stream(images)`, ... (fields: model, version, label, request_id and the
    task's options); a pipeline of its model config by `client.run_pipeline(image, name,
    min_score=0.4)` and `client.run_pipeline_stream(images, name)`. Raises grpc.RpcError on
    failure."""

    def __init__(
        self,
        target: str,
        *,
        bindings: Bindings = BUILT_IN,
        timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: TLS | None = None,
    ) -> None:
        super().__init__(target, timeout, max_message_bytes, tls)
        self.bindings = bindings
        self._tasks: dict[str, TaskClient] = {}
        self._pipeline_stub: ppb_grpc.PipelineServiceStub | None = None

    def _task(self, verb: str) -> TaskClient:
        task = self._tasks.get(verb)
        if task is None:  # KeyError: not a task of these bindings
            task = self._tasks[verb] = TaskClient.on(self, self.bindings.for_verb(verb))
        return task

    def call(self, verb: str, image: bytes, **fields: Any) -> Any:
        """One encoded image through the task `verb`; its result message."""
        return self._task(verb).call(image, **fields)

    def stream(self, verb: str, images: Iterable[bytes], **fields: Any) -> Iterator[Any]:
        """Streams images (e.g. video frames) through the task `verb`; yields results in the
        same order (a result with `error` set for an image that failed on its own)."""
        return self._task(verb).stream(images, **fields)

    def run_pipeline(self, image: bytes, pipeline: str, **fields: Any) -> Any:
        """One encoded image through the gateway's pipeline `pipeline` ([pipelines.NAME] of
        its model config; fields: request_id, and the first model's min_score and
        max_detections); its pipeline.v1 PipelineResult."""
        request = pipeline_request(image, pipeline, **fields)
        return self._pipelines().Run(request, timeout=self.timeout)

    def run_pipeline_stream(
        self, images: Iterable[bytes], pipeline: str, **fields: Any
    ) -> Iterator[Any]:
        """Streams images through the pipeline; yields PipelineResults in the same order (one
        with `error` set for an image that failed on its own)."""
        requests = (pipeline_request(image, pipeline, **fields) for image in images)
        yield from self._pipelines().RunStream(requests, timeout=self.timeout)

    def _pipelines(self) -> ppb_grpc.PipelineServiceStub:
        if self._pipeline_stub is None:
            self._pipeline_stub = ppb_grpc.PipelineServiceStub(self._channel)
        return self._pipeline_stub

    def __getattr__(self, name: str) -> Callable[..., Any]:
        verb = name.removesuffix("_stream")
        if name.startswith("_") or verb not in self.bindings.verbs:
            raise AttributeError(
                f"{type(self).__name__} has no {name!r}; the tasks are "
                f"{', '.join(self.bindings.verbs)} (and each with _stream)"
            )
        return partial(self.stream if name.endswith("_stream") else self.call, verb)


class TaskClient(_Channel):
    """Blocking client of one task's service (its binding)."""

    def __init__(
        self,
        target: str,
        binding: Binding,
        *,
        timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: TLS | None = None,
    ) -> None:
        super().__init__(target, timeout, max_message_bytes, tls)
        self._bind(binding)

    @classmethod
    def on(cls, client: _Channel, binding: Binding) -> TaskClient:
        """The task's client on `client`'s channel (closing either closes it)."""
        task = cls.__new__(cls)
        task.timeout, task._channel = client.timeout, client._channel
        task._bind(binding)
        return task

    def _bind(self, binding: Binding) -> None:
        self.binding = binding
        self._unary, self._stream = task_methods(self._channel, binding)

    def call(self, image: bytes, **fields: Any) -> Any:
        """One encoded image (fields: model, version, label, request_id and the task's
        options). Raises grpc.RpcError on failure."""
        return self._unary(task_request(self.binding, image, **fields), timeout=self.timeout)

    def stream(self, images: Iterable[bytes], **fields: Any) -> Iterator[Any]:
        """Streams images (e.g. video frames); yields results in the same order (a result
        with `error` set for an image that failed on its own)."""
        requests = (task_request(self.binding, image, **fields) for image in images)
        yield from self._stream(requests, timeout=self.timeout)


# The names of the first release, kept for one more: each is the client of every task now.
DetectionClient = GatewayClient
ClassificationClient = GatewayClient
