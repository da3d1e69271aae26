"""Batch jobs that do not simply run to the end: cancelled mid-run, a gateway SIGKILLed
mid-job and restarted, inputs that vanish, limits, a paused lane.

The gateways call TF Serving through tests/support/faultupstream.py, which holds every Predict
after the first N: a job stops at a known point however fast the machine is, so what the test
does "mid-run" (cancel, kill, remove an input) always happens mid-run. Lines are committed in
input order, so of N answers at least N minus the images in flight (4) are committed."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2 as lro

from tests.support.jobs import Client, State, gateway, make_images, metadata, result


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("jobs-lifecycle") / "images"
    make_images(directory, 1000)
    return directory


def test_cancel_mid_run_stops_work_and_keeps_what_is_done(
    upstream, images, tmp_path, store
) -> None:
    with gateway(upstream, store, tmp_path) as gw, gw.channel() as channel:
        client = Client(channel)
        upstream.hold(after=100)
        op = client.create(input_uri=str(images))
        client.until(op.name, lambda m: m.processed >= 90)
        upstream.wait_active(1)  # the job waits for its next answer
        client.ops.CancelOperation(lro.CancelOperationRequest(name=op.name))
        done = client.wait(op.name)
        meta = metadata(done)
        assert meta.state == State.CANCELLED
        assert done.error.code == grpc.StatusCode.CANCELLED.value[0]
        assert 90 <= meta.processed <= 100
        # What was done stays readable, in input order, and nothing more is added.
        lines = client.lines(op.name)
        assert [x.id for x in lines] == [f"img-{i:05d}.jpg" for i in range(meta.processed)]
        assert all(x.HasField("result") for x in lines)
        again = client.wait(op.name)
        assert metadata(again).processed == meta.processed
        assert len(client.lines(op.name)) == meta.processed
        listed = client.ops.ListOperations(lro.ListOperationsRequest(filter="state=CANCELLED"))
        assert [o.name for o in listed.operations] == [op.name]


def test_gateway_killed_mid_job_resumes_and_every_input_lands_once(
    upstream, images, tmp_path, store
) -> None:
    with gateway(upstream, store, tmp_path) as gw, gw.channel() as channel:
        client = Client(channel)
        upstream.hold(after=150)
        name = client.create(input_uri=str(images), shards=2).name
        at_kill = client.until(name, lambda m: m.processed >= 140)
        upstream.wait_active(1)  # the job waits for its next answer
        gw.process.kill()  # SIGKILL: no drain, no last checkpoint
        gw.process.wait()
    assert at_kill.processed <= 150
    upstream.release()
    with gateway(upstream, store, tmp_path) as gw, gw.channel() as channel:
        client = Client(channel)
        listed = client.ops.ListOperations(lro.ListOperationsRequest()).operations
        assert [o.name for o in listed] == [name]  # the restarted gateway knows the job
        done = client.wait(name)
        meta = metadata(done)
        assert meta.state == State.SUCCEEDED, done.error
        assert (meta.total, meta.processed, meta.failed) == (1000, 1000, 0)
        assert dict(result(done).code_counts) == {"OK": 1000}
        ids = [x.id for x in client.lines(name)]
    assert ids == [f"img-{i:05d}.jpg" for i in range(1000)]
    assert max(Counter(ids).values()) == 1


def test_an_input_vanishing_mid_run_fails_the_job_naming_it(upstream, tmp_path, store) -> None:
    directory = tmp_path / "images"
    paths = make_images(directory, 1000)
    with gateway(upstream, store, tmp_path) as gw, gw.channel() as channel:
        client = Client(channel)
        upstream.hold(after=100)
        name = client.create(input_uri=str(directory)).name
        client.until(name, lambda m: m.processed >= 90)
        upstream.wait_active(1)  # the job waits for its next answer, far before image 600
        paths[600].unlink()
        upstream.release()
        done = client.wait(name)
        assert metadata(done).state == State.FAILED
        assert done.error.code == grpc.StatusCode.NOT_FOUND.value[0]
        assert str(paths[600]) in done.error.message and "first missing input" in done.error.message
        lines = client.lines(name)
        assert [x.id for x in lines[:600]] == [p.name for p in paths[:600]]


def test_limits_per_caller_and_in_total_with_a_paused_lane(tfs, images, tmp_path, store) -> None:
    extra = [
        "--batch-yield-threshold=0",  # batch work paused: jobs stay unfinished
        "--batch-max-jobs-per-caller=2",
        "--batch-max-jobs=3",
        "--trust-xfcc=true",  # the header names the second caller
    ]
    other = (("x-forwarded-client-cert", 'By=spiffe://a;URI="spiffe://cluster.local/ns/b/sa/c"'),)
    with gateway(tfs, store, tmp_path, extra) as gw, gw.channel() as channel:
        client = Client(channel)
        first = client.create(input_uri=str(images)).name
        client.create(input_uri=str(images))
        with pytest.raises(grpc.RpcError) as info:
            client.create(input_uri=str(images))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "caller anonymous has its limit of 2" in info.value.details()
        them = Client(channel, other)
        queued = them.create(input_uri=str(images)).name
        with pytest.raises(grpc.RpcError) as info:
            them.create(input_uri=str(images))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 3 unfinished batch jobs" in info.value.details()

        # A paused job is RUNNING with nothing processed; WaitOperation returns at its timeout.
        started = time.monotonic()
        wait = lro.WaitOperationRequest(name=first)
        wait.timeout.FromMilliseconds(300)
        op = client.ops.WaitOperation(wait, timeout=10)
        assert not op.done and time.monotonic() - started >= 0.3
        assert metadata(op).processed == 0
        assert metadata(them.get(queued)).state == State.QUEUED
        client.ops.CancelOperation(lro.CancelOperationRequest(name=first))
        assert metadata(client.wait(first)).state == State.CANCELLED
        # The two slots (--batch-max-running 2) went to the first two jobs: the third waits
        # QUEUED until one is free (the cancelled one's), then runs (paused).
        them.until(queued, lambda m: m.state == State.RUNNING)
        fourth = client.create(input_uri=str(images)).name  # anonymous has room again
        client.until(fourth, lambda m: m.state == State.QUEUED)
        client.ops.CancelOperation(lro.CancelOperationRequest(name=fourth))
        assert metadata(client.wait(fourth)).state == State.CANCELLED  # cancelled while queued
