"""A programmable TF Serving for fault tests: a real gRPC server on the TF Serving paths that
forwards to a real (local) TF Serving and injects faults on demand.

    with FaultyUpstream(tfs.target) as upstream:
        upstream.delay = 5.0                      # slow Predicts
        upstream.fail_next(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
        upstream.mutate = lambda response: ...    # broken answers (a tfs.PredictResponse)
        upstream.hold()                           # Predicts wait until release()
        upstream.hold(after=100)                  # ... all but the next 100
        upstream.hold(only=lambda r: r.model_spec.version.value == 3)   # ... only these
        upstream.fail_next(grpc.StatusCode.UNAVAILABLE, "...", method="GetModelMetadata")

It counts calls per method, Predicts in progress, and Predicts whose caller went away
(deadline or cancellation) before the answer, and records the metadata of every call
(`received`: method name and the caller's metadata as a dict). Bytes pass through
untouched unless a mutation is set. Binds 127.0.0.1 only; optional TLS/mTLS with `credentials`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import grpc

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import GET_MODEL_METADATA, GET_MODEL_STATUS, PREDICT
from tests.support.deadline import forwarded_timeout

UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# Enough threads for every Predict a test holds at once plus health checks.
THREADS = 96
_POLL = 0.01


class FaultyUpstream:
    def __init__(self, backend: str, credentials: grpc.ServerCredentials | None = None) -> None:
        self.backend = backend
        self.credentials = credentials
        self.delay = 0.0
        self.mutate: Callable[[tfs.PredictResponse], None] | None = None
        self.calls: Counter[str] = Counter()
        self.active = 0
        self.cancelled = 0
        # (method name, the caller's metadata) for every call, in arrival order.
        self.received: list[tuple[str, dict[str, str]]] = []
        # (method name, the caller's address as gRPC names it, e.g. "ipv4:127.0.0.1:40312").
        self.peers: list[tuple[str, str]] = []
        # (method name, seconds the caller's deadline left on arrival, None without one).
        self.deadlines: list[tuple[str, float | None]] = []
        # (method name, the caller's deadline as a time.monotonic() instant, None without one):
        # the upstream runs in the test's process, so tests compare it with their own clock.
        self.deadline_at: list[tuple[str, float | None]] = []
        # Callers (addresses as in `peers`) whose calls of any method get UNAVAILABLE: one
        # gateway process among several loses TF Serving while the others keep it.
        self.cut_off: set[str] = set()
        self._failures: dict[str, deque[tuple[grpc.StatusCode, str, float]]] = {}
        self._released = threading.Event()
        self._released.set()
        self._passes = 0  # Predicts still let through while holding (hold(after=...))
        # Which Predicts a hold holds (hold(only=...)); None: all.
        self._only: Callable[[tfs.PredictRequest], bool] | None = None
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(backend, options=UNLIMITED)
        self._server = grpc.server(ThreadPoolExecutor(THREADS), options=UNLIMITED)
        handlers = {
            path.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(self._handler(path))
            for path in (PREDICT, GET_MODEL_METADATA)
        }
        status = {"GetModelStatus": grpc.unary_unary_rpc_method_handler(
            self._handler(GET_MODEL_STATUS)
        )}  # fmt: skip
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "tensorflow.serving.PredictionService", handlers
                ),
                grpc.method_handlers_generic_handler("tensorflow.serving.ModelService", status),
            )
        )
        if credentials is None:
            self.port = self._server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self._server.add_secure_port("127.0.0.1:0", credentials)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FaultyUpstream:
        self._server.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
        self._server.stop(grace=None).wait()
        self._channel.close()

    # --- controls -------------------------------------------------------------------

    def fail_next(
        self,
        code: grpc.StatusCode,
        details: str,
        times: int = 1,
        method: str = "Predict",
        after: float = 0.0,
    ) -> None:
        """The next `times` calls of `method` (Predict, GetModelMetadata, GetModelStatus) are
        answered with this status, without forwarding, `after` seconds after they arrive."""
        with self._lock:
            self._failures.setdefault(method, deque()).extend([(code, details, after)] * times)

    def metadata_of(self, method: str) -> list[dict[str, str]]:
        """The metadata each call of `method` arrived with, in order."""
        with self._lock:
            return [metadata for name, metadata in self.received if name == method]

    def hold(
        self, after: int = 0, only: Callable[[tfs.PredictRequest], bool] | None = None
    ) -> None:
        """Predicts from now on wait (after forwarding nothing) until release(), except the
        next `after` of them, which pass: work that runs on can be stopped at a known point.
        With `only`, just the Predicts whose request it accepts are held."""
        with self._lock:
            self._passes = after
            self._only = only
            self._released.clear()

    def release(self) -> None:
        self._released.set()

    def wait_active(self, count: int, timeout: float = 60.0) -> None:
        """Waits until `count` Predicts are in progress here."""
        deadline = time.monotonic() + timeout
        while self.active < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.active} Predicts in progress, wanted {count}")
            time.sleep(_POLL)

    def wait_cancelled(self, count: int, timeout: float = 60.0) -> None:
        """Waits until `count` Predicts in all have seen their caller go away."""
        deadline = time.monotonic() + timeout
        while self.cancelled < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.cancelled} Predicts cancelled, wanted {count}")
            time.sleep(_POLL)

    # --- serving --------------------------------------------------------------------

    def _handler(self, path: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        name = path.rsplit("/", 1)[1]
        forward = self._channel.unary_unary(path)  # raw bytes both ways

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            metadata = {
                key: value for key, value in context.invocation_metadata() if isinstance(value, str)
            }
            peer = context.peer()
            with self._lock:
                self.calls[name] += 1
                self.received.append((name, metadata))
                self.peers.append((name, peer))
                left = context.time_remaining()
                self.deadlines.append((name, left))
                self.deadline_at.append((name, None if left is None else time.monotonic() + left))
                failures = self._failures.get(name)
                failure = failures.popleft() if failures else None
            if peer in self.cut_off:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"{peer} is cut off (fault test)")
            if path != PREDICT:
                if failure is not None:
                    self._fail(context, *failure)
                return self._forward(forward, request, context)
            with self._lock:
                self.active += 1
                passes = self._passes > 0 and not self._released.is_set()
                if passes:
                    self._passes -= 1
                only = self._only
            if only is not None and not only(tfs.PredictRequest.FromString(request)):
                passes = True
            try:
                if failure is not None:
                    self._fail(context, *failure)
                if not self._wait(context, held=not passes):
                    with self._lock:
                        self.cancelled += 1
                    context.abort(grpc.StatusCode.CANCELLED, "caller went away")
                response = self._forward(forward, request, context)
                mutate = self.mutate
                if mutate is None:
                    return response
                message = tfs.PredictResponse.FromString(response)
                mutate(message)
                return message.SerializeToString()
            finally:
                with self._lock:
                    self.active -= 1

        return handle

    @staticmethod
    def _fail(
        context: grpc.ServicerContext, code: grpc.StatusCode, details: str, after: float
    ) -> None:
        if after:
            # Waits on an event nobody sets: a plain timed wait that the caller's going
            # away does not shorten (the failure is what is being tested).
            threading.Event().wait(after)
        context.abort(code, details)

    def _wait(self, context: grpc.ServicerContext, held: bool = True) -> bool:
        """Sleeps the delay and, if `held`, waits for release(); False if the caller went
        away."""
        until = time.monotonic() + self.delay
        while time.monotonic() < until or (held and not self._released.is_set()):
            if not context.is_active():
                return False
            time.sleep(_POLL)
        return context.is_active()

    @staticmethod
    def _forward(
        forward: grpc.UnaryUnaryMultiCallable, request: bytes, context: grpc.ServicerContext
    ) -> bytes:
        try:
            return forward(request, timeout=forwarded_timeout(context))  # type: ignore[no-any-return]
        except grpc.RpcError as e:
            context.abort(e.code(), e.details() or "")
            raise  # unreachable: abort raises
