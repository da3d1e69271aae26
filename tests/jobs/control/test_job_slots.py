"""GATEWAY_BATCH_MAX_JOBS holds across replicas (issue 33 item 2): the unfinished jobs are
counted in the store's tally (gateway.jobs.control.tally), each create taking its slot by one
conditional write, so two gateway processes sharing a store, sent creates at the same time,
admit no more jobs together than the limit; a job that ends gives its slot back."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import grpc
from google.longrunning import operations_pb2 as lro

from tests.support.faultupstream import FaultyUpstream
from tests.support.jobs import Client, State, gateway, make_images, metadata
from tests.support.waiting import wait_for

LIMIT = 3
RACERS = 12  # creates sent at once, half through each replica


def test_two_replicas_racing_creates_admit_no_more_than_the_limit(
    upstream: FaultyUpstream, tmp_path: Path, store: Path
) -> None:
    images = tmp_path / "images"
    make_images(images, 4)
    upstream.hold()  # admitted jobs stay unfinished until the end
    extra = [f"--batch-max-jobs={LIMIT}", "--batch-max-jobs-per-caller=100"]
    with ExitStack() as stack:
        processes = [stack.enter_context(gateway(upstream, store, tmp_path, extra)) for _ in "ab"]
        clients = [Client(stack.enter_context(p.channel())) for p in processes]
        start = threading.Barrier(RACERS)

        def create(i: int) -> str:
            client = clients[i % 2]
            start.wait()
            try:
                return client.create(input_uri=str(images)).name
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert "GATEWAY_BATCH_MAX_JOBS" in str(e.details()), e.details()
                return ""

        with ThreadPoolExecutor(RACERS) as pool:
            names = [n for n in pool.map(create, range(RACERS)) if n]
        assert len(names) == LIMIT, f"{len(names)} jobs admitted with a limit of {LIMIT}"
        assert len(set(names)) == LIMIT

        # A job that ends gives its slot back, whichever replica ends it.
        cancel = lro.CancelOperationRequest(name=names[0])
        clients[1].ops.CancelOperation(cancel, timeout=30)
        assert metadata(clients[1].wait(names[0])).state == State.CANCELLED
        # The slot goes back just after the record that ended the job is written.
        usage = store / "usage.json"
        wait_for(lambda: json.loads(usage.read_text())["jobs"] == LIMIT - 1, "the slot back")
        assert clients[0].create(input_uri=str(images)).name
        refused = refused_create(clients[1], images)
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def refused_create(client: Client, images: Path) -> grpc.RpcError:
    try:
        client.create(input_uri=str(images))
    except grpc.RpcError as e:
        return e
    raise AssertionError("a create past GATEWAY_BATCH_MAX_JOBS was admitted")
