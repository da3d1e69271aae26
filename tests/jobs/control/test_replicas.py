"""Two gateway processes sharing one job store: any replica answers for every operation, one
runs each job (under its lease), and when the process running a job is SIGKILLed the other
takes it over and finishes it with every input exactly once, the results identical to an
uninterrupted run. TF Serving sits behind a counting proxy (tests/support/faultupstream.py),
so "each image reaches TF Serving about once" is measured where it happens. With a local
store and with S3 (moto's server on loopback, through s3fs)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.longrunning import operations_pb2 as lro

from tests.support import tools
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, State, gateway, make_images, metadata, ran
from tests.support.localserver import LocalServer, free_port
from tests.support.waiting import wait_for

COUNT = 600
# JOBS_REPLICA_ROUNDS=N repeats each test N times (as BATCH_KILL_ROUNDS for the runner).
ROUNDS = range(int(os.environ.get("JOBS_REPLICA_ROUNDS", "1")))
# A SIGKILLed holder's job is taken over 15 s later. The holder renews every third of it: on a
# loaded machine (and a slow S3) a renewal may come seconds late, never 10 s.
LEASE = ["--job-lease-seconds=15"]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "foo", "AWS_SECRET_ACCESS_KEY": "foo",
               "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("replicas") / "images"
    make_images(directory, COUNT)
    return directory


@pytest.fixture
def upstream(tfs: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(tfs.target) as proxy:
        yield proxy


@contextmanager
def replicas(
    upstream: FaultyUpstream,
    store: str,
    log_dir: Path,
    count: int = 2,
    extra: Sequence[str] = (),
) -> Iterator[list[GatewayProcess]]:
    """`count` gateways on one store, each calling TF Serving through `upstream`."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(gateway(upstream, store, log_dir, [*LEASE, *extra]))
            for _ in range(count)
        ]


@pytest.mark.parametrize("round_", ROUNDS)
def test_any_replica_answers_and_one_runs_each_job(
    round_: int, upstream: FaultyUpstream, images: Path, tmp_path: Path, store: Path
) -> None:
    with replicas(upstream, str(store), tmp_path, count=1) as (first,), first.channel() as c1:
        one = Client(c1)
        name = one.create(input_uri=str(images)).name
        one.until(name, lambda m: m.processed > 0)
        # A second replica starts while the first runs the job: it answers for the job and
        # does not start it again.
        with replicas(upstream, str(store), tmp_path, count=1) as (second,), second.channel() as c2:
            two = Client(c2)
            assert metadata(two.get(name)).state in (State.RUNNING, State.SUCCEEDED)
            listed = two.ops.ListOperations(lro.ListOperationsRequest()).operations
            assert [o.name for o in listed] == [name]
            done = two.wait(name)
            assert metadata(done).state == State.SUCCEEDED, done.error
            assert metadata(done).processed == COUNT
            assert [x.id for x in two.lines(name)] == sorted(p.name for p in images.iterdir())
            assert ran(first, name) and not ran(second, name)
            # Each image reached TF Serving once.
            assert upstream.calls["Predict"] == COUNT

            # Cancel through the replica that does not run the job; delete through the other.
            other = one.create(input_uri=str(images)).name
            two.until(other, lambda m: m.processed > 0)
            runner, idle = (one, two) if ran(first, other) else (two, one)
            idle.ops.CancelOperation(lro.CancelOperationRequest(name=other))
            cancelled = runner.wait(other)
            assert metadata(cancelled).state == State.CANCELLED
            assert cancelled.error.code == grpc.StatusCode.CANCELLED.value[0]
            kept = metadata(cancelled).processed
            assert 0 < kept < COUNT and len(idle.lines(other)) == kept
            two.ops.DeleteOperation(lro.DeleteOperationRequest(name=name))
            with pytest.raises(grpc.RpcError) as info:
                one.get(name)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


def result_files(op: lro.Operation, read: Any) -> dict[str, bytes]:
    out = metadata(op).output_uri
    return {"results-00000-of-00001.jsonl": read(f"{out}/results-00000-of-00001.jsonl")}


def kill_the_holder_and_finish(
    upstream: FaultyUpstream,
    store: str,
    source: str,
    log_dir: Path,
    read: Any,
    extra: Sequence[str] = (),
) -> None:
    with replicas(upstream, store, log_dir, extra=extra) as processes, ExitStack() as stack:
        clients = [Client(stack.enter_context(p.channel())) for p in processes]
        # A quarter of the images reach TF Serving, then it holds the rest: the kill lands
        # mid-job, after some results are committed, whatever the machine's speed.
        upstream.hold(after=COUNT // 4)
        name = clients[0].create(input_uri=source).name
        wait_for(lambda: any(ran(p, name) for p in processes), "a replica taking the job")
        holders = [i for i, p in enumerate(processes) if ran(p, name)]
        assert len(holders) == 1, "both replicas run the job: the lease was not kept"
        holder = holders[0]
        survivor = clients[1 - holder]
        at_kill = survivor.until(name, lambda m: m.processed > 0)
        processes[holder].process.kill()  # SIGKILL: no drain, no release
        processes[holder].process.wait()
        upstream.release()
        assert 0 < at_kill.processed <= COUNT // 4
        done = survivor.wait(name)
        meta = metadata(done)
        assert meta.state == State.SUCCEEDED, done.error
        assert (meta.total, meta.processed, meta.failed) == (COUNT, COUNT, 0)
        ids = [x.id for x in survivor.lines(name)]
        assert len(ids) == COUNT and max(Counter(ids).values()) == 1
        assert ran(processes[1 - holder], name)
        # About once: each image reached TF Serving once, plus the few the killed
        # process had sent but not committed.
        first_run = upstream.calls["Predict"]
        assert COUNT <= first_run <= COUNT + COUNT // 4, first_run

        # The same job uninterrupted, through the survivor: the same bytes.
        again = survivor.wait(survivor.create(input_uri=source).name)
        assert upstream.calls["Predict"] - first_run == COUNT
        assert result_files(done, read) == result_files(again, read)


@pytest.mark.parametrize("round_", ROUNDS)
def test_a_sigkilled_holder_is_taken_over_exactly_once_local_store(
    round_: int, upstream: FaultyUpstream, images: Path, tmp_path: Path, store: Path
) -> None:
    kill_the_holder_and_finish(
        upstream, str(store), str(images), tmp_path, lambda p: Path(p).read_bytes()
    )


@pytest.fixture(scope="module")
def s3(images: Path) -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1 with the images in s3://replicas-in/images; the
    gateways started meanwhile reach it through the environment they inherit."""
    s3fs = tools.module("s3fs", "the dev extra (make venv)")
    moto_server = tools.module("moto.server", "the dev extra (make venv)")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint}.items():
            patch.setenv(key, value)
        patch.delenv("AWS_PROFILE", raising=False)
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem(anon=False, endpoint_url=endpoint)
        fs.mkdir("replicas-in")
        fs.mkdir("replicas-store")
        for path in sorted(images.iterdir()):
            fs.pipe_file(f"replicas-in/images/{path.name}", path.read_bytes())
        try:
            yield fs
        finally:
            server.stop()


@pytest.mark.parametrize("round_", ROUNDS)
def test_a_sigkilled_holder_is_taken_over_exactly_once_s3_store(
    round_: int, upstream: FaultyUpstream, s3: Any, tmp_path: Path
) -> None:
    def read(url: str) -> bytes:
        s3.invalidate_cache()
        return bytes(s3.cat_file(url))

    store = f"s3://replicas-store/{tmp_path.name}"
    inputs = ["--batch-allowed-input-uris=s3://replicas-in"]
    kill_the_holder_and_finish(upstream, store, "s3://replicas-in/images", tmp_path, read, inputs)
    s3.invalidate_cache()
    assert s3.find(f"replicas-store/{tmp_path.name}/leases"), "no lease was kept in the bucket"
