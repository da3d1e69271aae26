"""Datasets, gateways and waiting for operations, for the batch-job tests."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2 as lro
from google.longrunning import operations_pb2_grpc as lro_grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image

from gateway.api.channel import open_channel
from gateway.proto.vision.v1 import batch_pb2 as bpb
from gateway.proto.vision.v1 import batch_pb2_grpc as bpb_grpc
from gateway.tls import TLS
from tests.support.certs import Certificates
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = ROOT / "serving" / "gateway-models.toml"
State = bpb.BatchJobMetadata.State
# Where the gateways these tests start let jobs read: the session's temporary directory
# (set by tests/jobs/conftest.py), under which every test makes its datasets.
ALLOWED_INPUTS: list[str] = []


def make_images(directory: Path, count: int, size: tuple[int, int] = (64, 48)) -> list[Path]:
    """`count` small JPEGs of different colours, named so that name order is input order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        colour = ((index * 37) % 256, (index * 91) % 256, (index * 53) % 256)
        buffer = io.BytesIO()
        Image.new("RGB", size, colour).save(buffer, "JPEG", quality=90)
        path = directory / f"img-{index:05d}.jpg"
        path.write_bytes(buffer.getvalue())
        paths.append(path)
    return paths


def jpeg(seed: int) -> bytes:
    """A small JPEG (32x24) of one colour, different for each seed, as bytes to upload."""
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (seed * 40 % 256, 90, 160)).save(buffer, "JPEG")
    return buffer.getvalue()


@contextmanager
def gateway(
    tfs: LocalServer | FaultyUpstream,
    store: Path | str,
    log_dir: Path,
    extra: Sequence[str] = (),
    certs: Certificates | None = None,
    http: bool = False,
) -> Iterator[GatewayProcess]:
    """A gateway with the jobs API; with `certs`, mTLS on its port (clients need a
    certificate from certs.ca: open them with `channel`); with `http`, the HTTP door too."""
    args = [
        f"--model-config={MODEL_CONFIG}",
        f"--job-store={store}",
        "--batch-checkpoint-seconds=0.2",
        f"--batch-allowed-input-uris={','.join(ALLOWED_INPUTS)}",
        # Without certificates every caller is anonymous: one shared tenant, as `make run`.
        *(["--batch-allow-anonymous=true"] if certs is None else []),
        *extra,
    ]
    if certs is not None:
        args += [
            f"--tls-cert-file={certs.server.cert}",
            f"--tls-key-file={certs.server.key}",
            f"--tls-client-ca-file={certs.ca}",
        ]
    with run_gateway(tfs.target, args, log_dir=log_dir, wait_ready=certs is None, http=http) as gw:
        if certs is not None:
            with channel(gw, certs) as ready:
                _wait_serving(ready)
        yield gw


@contextmanager
def gateway_under(
    tfs: LocalServer,
    root: Path,
    extra: Sequence[str],
    certs: Certificates | None = None,
    http: bool = False,
) -> Iterator[GatewayProcess]:
    """`gateway` with its store and logs under `root` (made when missing)."""
    root.mkdir(parents=True, exist_ok=True)
    with gateway(tfs, root / "store", root, extra, certs, http) as gw:
        yield gw


def channel(
    gw: GatewayProcess, certs: Certificates | None = None, client: str | None = None
) -> grpc.Channel:
    """A channel to the gateway: plaintext, or TLS with the client certificate `client`
    (one of certs.clients; None: certs.client)."""
    if certs is None:
        return gw.channel()
    pair = certs.clients[client] if client else certs.client
    return open_channel(gw.target, TLS(str(certs.ca), str(pair.cert), str(pair.key)))


def _wait_serving(ready: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(ready)
    deadline = time.monotonic() + 120
    while True:
        try:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "the gateway did not become SERVING over TLS"
        time.sleep(0.1)


def options(message: Message) -> any_pb2.Any:
    """A CreateBatchJobRequest's `options`: the task's request message with its options set."""
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


class Client:
    """The official Operations stub and our BatchService stub on one channel; `metadata` goes
    with every call (e.g. an x-forwarded-client-cert naming the caller)."""

    def __init__(self, channel: grpc.Channel, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.batch = bpb_grpc.BatchServiceStub(channel)
        self.ops = lro_grpc.OperationsStub(channel)
        self.metadata = tuple(metadata)

    def create(self, **fields: object) -> lro.Operation:
        request = bpb.CreateBatchJobRequest(**fields)
        return self.batch.CreateBatchJob(request, timeout=30, metadata=self.metadata)

    def get(self, name: str) -> lro.Operation:
        request = lro.GetOperationRequest(name=name)
        return self.ops.GetOperation(request, timeout=10, metadata=self.metadata)

    def wait(self, name: str, seconds: float = 120) -> lro.Operation:
        """WaitOperation until done (it may return early: call again)."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{name} not done after {seconds} s: {metadata(self.get(name))}"
            request = lro.WaitOperationRequest(name=name)
            request.timeout.FromSeconds(int(min(left, 30)) + 1)
            op = self.ops.WaitOperation(request, timeout=min(left, 30) + 5, metadata=self.metadata)
            if op.done:
                return op

    def until(
        self, name: str, check: Callable[[bpb.BatchJobMetadata], bool], seconds: float = 120
    ) -> bpb.BatchJobMetadata:
        """Polls GetOperation until `check(metadata)` holds."""
        deadline = time.monotonic() + seconds
        while True:
            found = metadata(self.get(name))
            if check(found):
                return found
            assert time.monotonic() < deadline, f"condition not met after {seconds} s: {found}"
            time.sleep(0.02)

    def lines(self, name: str, token: str = "") -> list[bpb.BatchResultLine]:
        request = bpb.ReadBatchResultsRequest(name=name, page_token=token)
        return list(self.batch.ReadBatchResults(request, timeout=60, metadata=self.metadata))


def refused(call: object, *args: object, **kwargs: object) -> grpc.RpcError:
    """The error of a call that must fail (a stream's: once read to its end)."""
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)  # type: ignore[operator]
        if hasattr(result, "__iter__") and not isinstance(result, bytes | str):
            list(result)
    return info.value


def ran(gw: GatewayProcess, name: str) -> bool:
    """The gateway process logged that it runs the operation `name` (it holds its lease)."""
    return any(
        r.get("message") == "batch job running" and r.get("operation") == name for r in gw.records()
    )


def metadata(op: lro.Operation) -> bpb.BatchJobMetadata:
    found = bpb.BatchJobMetadata()
    assert op.metadata.Unpack(found)
    return found


def result(op: lro.Operation) -> bpb.BatchJobResult:
    found = bpb.BatchJobResult()
    assert op.response.Unpack(found), op
    return found


def runner_pids(gw: GatewayProcess) -> list[int]:
    """The batch runner processes (gateway.jobs.runner.child) the gateway process runs now."""
    found = []
    for task in Path(f"/proc/{gw.process.pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
        for pid in children:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"gateway.jobs.runner.child" in command:
                found.append(int(pid))
    return sorted(set(found))


def new_runner(gw: GatewayProcess, seen: Sequence[int], seconds: float = 120) -> int:
    """Waits for a runner process of the gateway that is not one of `seen`."""
    deadline = time.monotonic() + seconds
    while True:
        fresh = [pid for pid in runner_pids(gw) if pid not in seen]
        if fresh:
            return fresh[0]
        assert gw.process.poll() is None, "the gateway exited"
        assert time.monotonic() < deadline, f"no new batch runner after {seconds} s"
        time.sleep(0.01)
