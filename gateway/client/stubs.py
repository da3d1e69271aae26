"""Stubs for a task's service, made from its binding: blocking clients for scripts and the
command line, asyncio stubs for the batch runner."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

from gateway.api.bindings import Binding
from gateway.api.channel import DEFAULT_MAX_MESSAGE_BYTES, open_channel, task_methods
from gateway.client.messages import task_request
from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.tasks.builtin import BUILT_IN
from gateway.tls import TLS


class TaskClient:
    """Blocking client of one task's service; one channel, reused for every call."""

    def __init__(
        self,
        target: str,
        binding: Binding,
        *,
        timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: TLS | None = None,
    ) -> None:
        self.binding = binding
        self.timeout = timeout
        self._channel = open_channel(target, tls, max_message_bytes)
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


class DetectionClient(TaskClient):
    """Blocking detection.v1 client."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, BUILT_IN.for_verb("detect"), **kwargs)

    def detect(self, image: bytes, **fields: Any) -> pb.DetectionResult:
        """Runs detection on one encoded image. Raises grpc.RpcError on failure."""
        result: pb.DetectionResult = self.call(image, **fields)
        return result

    def detect_stream(self, images: Iterable[bytes], **fields: Any) -> Iterator[pb.DetectionResult]:
        """Streams images; yields results in the same order."""
        yield from self.stream(images, **fields)


class ClassificationClient(TaskClient):
    """Blocking classification.v1 client."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, BUILT_IN.for_verb("classify"), **kwargs)

    def classify(self, image: bytes, **fields: Any) -> cpb.ClassificationResult:
        """Classifies one encoded image. Raises grpc.RpcError on failure."""
        result: cpb.ClassificationResult = self.call(image, **fields)
        return result

    def classify_stream(
        self, images: Iterable[bytes], **fields: Any
    ) -> Iterator[cpb.ClassificationResult]:
        """Streams images; yields results in the same order."""
        yield from self.stream(images, **fields)
