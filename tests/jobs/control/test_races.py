"""Races between two gateway processes sharing one job store, through the real doors: a
holder stalled (SIGSTOP) past its lease while the other replica takes the job over and
renews twice; cancels racing a job's start and its end; a delete racing the running holder.
Records, leases and deletes change by conditional write (gateway.jobs.control.cas), so none of these
leaves a job stuck, run twice, or files behind."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.longrunning import operations_pb2 as lro

from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, State, gateway, make_images, metadata, ran
from tests.support.localserver import LocalServer

COUNT = 400


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("races") / "images"
    make_images(directory, COUNT)
    return directory


@pytest.fixture(scope="module")
def few(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("races-few") / "images"
    make_images(directory, 3)
    return directory


@contextmanager
def two(
    tfs: LocalServer, store: Path, log_dir: Path, extra: tuple[str, ...] = (), http: bool = False
) -> Iterator[tuple[list[GatewayProcess], list[Client]]]:
    with ExitStack() as stack:
        processes = [
            stack.enter_context(gateway(tfs, store, log_dir, extra, http=http)) for _ in range(2)
        ]
        clients = [Client(stack.enter_context(p.channel())) for p in processes]
        yield processes, clients


def wait_for(check: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.02)


def no_active_markers(store: Path, context: object = None) -> None:
    """Waits for the index of unfinished jobs to empty: a job's marker goes right after the
    record that ends it, which the other replica's client may read in between."""
    wait_for(lambda: not list((store / "active").iterdir()), f"no active markers ({context})")


def stall_outside_the_lease_lock(pid: int, store: Path) -> None:
    """SIGSTOPs `pid` at a moment it holds no lock of the leases' directory: a process
    stalled inside a local store's write keeps that directory's lock until it resumes
    (docs/jobs.md), so a stall there would keep every lease as it is."""
    with open(store / "leases" / ".lock", "a+b") as lock:
        for _ in range(100):
            os.kill(pid, signal.SIGSTOP)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # stopped inside a lease write: let it finish it
                os.kill(pid, signal.SIGCONT)
                fcntl.flock(lock, fcntl.LOCK_EX)  # until it released the lock
                fcntl.flock(lock, fcntl.LOCK_UN)
                continue
            fcntl.flock(lock, fcntl.LOCK_UN)
            return
    raise AssertionError("the holder was inside a lease write at each of 100 stops")


def lease(store: Path, name: str) -> dict[str, Any]:
    path = store / "leases" / f"{name.removeprefix('operations/')}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def logged(process: GatewayProcess, message: str, name: str) -> bool:
    return any(
        r.get("message") == message and r.get("operation") in (name, name.split("/")[-1])
        for r in process.records()
    )


def test_a_stalled_holder_loses_its_lease_to_the_replica_that_took_over(
    tfs: LocalServer, images: Path, tmp_path: Path, store: Path
) -> None:
    with two(tfs, store, tmp_path, ("--job-lease-seconds=2",)) as (processes, clients):
        name = clients[0].create(input_uri=str(images)).name
        wait_for(lambda: any(ran(p, name) for p in processes), "a replica taking the job")
        (first,) = [i for i, p in enumerate(processes) if ran(p, name)]
        holder, other = processes[first], processes[1 - first]
        clients[1 - first].until(name, lambda m: m.processed > 0)
        stalled = lease(store, name)
        stall_outside_the_lease_lock(holder.process.pid, store)
        try:
            # The other replica takes the job over once the lease expired, and renews twice.
            wait_for(lambda: lease(store, name).get("holder", stalled["holder"])
                     != stalled["holder"], "the other replica taking the lease")  # fmt: skip
            taken = lease(store, name)["generation"]
            wait_for(lambda: lease(store, name).get("generation", 0) >= taken + 2, "2 renewals")
        finally:
            os.kill(holder.process.pid, signal.SIGCONT)
        assert ran(other, name)
        wait_for(lambda: logged(holder, "batch job lease lost", name), "the stale renew failing")
        done = clients[1 - first].wait(name)
        meta = metadata(done)
        assert meta.state == State.SUCCEEDED, done.error
        assert (meta.total, meta.processed, meta.failed) == (COUNT, COUNT, 0)
        ids = [x.id for x in clients[first].lines(name)]
        assert len(ids) == COUNT and max(Counter(ids).values()) == 1
        # Only the holder of the lease ended the job.
        assert logged(other, "batch job ended", name)
        assert not logged(holder, "batch job ended", name)
        assert lease(store, name).get("holder") != stalled["holder"]


def test_cancels_racing_a_jobs_start_are_never_lost(
    tfs: LocalServer, images: Path, tmp_path: Path, store: Path
) -> None:
    with two(tfs, store, tmp_path) as (_, clients):
        names = []
        for round_ in range(4):
            creator, canceller = clients[round_ % 2], clients[1 - round_ % 2]
            name = creator.create(input_uri=str(images)).name
            canceller.ops.CancelOperation(lro.CancelOperationRequest(name=name), timeout=30)
            names.append(name)
        for name in names:
            done = clients[0].wait(name)
            assert metadata(done).state == State.CANCELLED, metadata(done)
            assert done.error.code == grpc.StatusCode.CANCELLED.value[0]
            assert metadata(done).processed < COUNT
        no_active_markers(store)


def test_cancels_racing_a_jobs_end_leave_it_ended(
    tfs: LocalServer, few: Path, tmp_path: Path, store: Path
) -> None:
    with two(tfs, store, tmp_path) as (_, clients):
        states = Counter()
        for round_ in range(6):
            creator, canceller = clients[round_ % 2], clients[1 - round_ % 2]
            name = creator.create(input_uri=str(few)).name
            seen = round_ % 3  # at once, after the first image, or as the job ends
            if seen:
                canceller.until(name, lambda m, n=seen: m.processed >= n or m.state > 2)
            canceller.ops.CancelOperation(lro.CancelOperationRequest(name=name), timeout=30)
            done = canceller.wait(name, seconds=60)
            meta = metadata(done)
            assert meta.state in (State.SUCCEEDED, State.CANCELLED), meta
            if meta.state == State.SUCCEEDED:
                assert meta.processed == 3 and len(canceller.lines(name)) == 3
            states[State.Name(meta.state)] += 1
        no_active_markers(store, states)


def test_a_delete_racing_the_running_holder_leaves_no_files(
    tfs: LocalServer, images: Path, tmp_path: Path, store: Path
) -> None:
    with two(tfs, store, tmp_path) as (processes, clients):
        name = clients[0].create(input_uri=str(images)).name
        wait_for(lambda: any(ran(p, name) for p in processes), "a replica taking the job")
        (first,) = [i for i, p in enumerate(processes) if ran(p, name)]
        idle = clients[1 - first]
        idle.until(name, lambda m: m.processed > 0)
        # Through the replica that does not run it: the holder finishes the delete.
        idle.ops.DeleteOperation(lro.DeleteOperationRequest(name=name), timeout=30)
        with pytest.raises(grpc.RpcError) as info:
            clients[first].get(name)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        job_id = name.removeprefix("operations/")
        wait_for(lambda: logged(processes[first], "batch job deleted", name), "the delete")
        assert not (store / "jobs" / job_id).exists()
        assert not (store / "operations" / f"{job_id}.json").exists()
        assert not (store / "leases" / f"{job_id}.json").exists()
        no_active_markers(store)
        listed = idle.ops.ListOperations(lro.ListOperationsRequest(), timeout=30).operations
        assert list(listed) == []
        tally = json.loads((store / "usage.json").read_text())
        assert tally["bytes"] == 0  # the record's reservation given back
        assert tally["jobs"] == 0  # and its slot among the unfinished jobs


def upload(url: str, files: list[Path]) -> tuple[int, dict[str, Any]]:
    """POST /v1/uploads with the real curl; (status, JSON body)."""
    binary = shutil.which("curl")
    assert binary, "curl is not installed (apt-get install -y curl)"
    args = [f"-Fimage=@{p}" for p in files]
    run = subprocess.run(
        [binary, "-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "90", *args,
         f"{url}/v1/uploads"],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    body, _, code = run.stdout.rpartition(b"\n")
    return int(code), json.loads(body)


def stored_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_concurrent_uploads_by_one_caller_hold_its_limits_across_replicas(
    tfs: LocalServer, tmp_path: Path, store: Path
) -> None:
    """10 uploads at once by one caller, through two replicas sharing the store: with 2 open
    uploads allowed, 2 get through and 8 are RESOURCE_EXHAUSTED; with 2 MiB per caller, what
    is kept never passes it, and the store's tally counts exactly what is on disk."""
    parts = []
    for index in range(3):  # 3 x 300 KB per upload: a third upload passes 2 MiB
        part = tmp_path / f"part-{index}.bin"
        part.write_bytes(os.urandom(300_000))
        parts.append(part)
    limits = ("--batch-max-uploads-per-caller=2", f"--batch-max-upload-bytes-per-caller={2 << 20}",
              f"--job-store-max-bytes={4 << 20}")  # fmt: skip
    with two(tfs, store, tmp_path, limits, http=True) as (processes, _):
        urls = [p.http_url for p in processes]
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda i: upload(urls[i % 2], parts), range(10)))
        codes = Counter(code for code, _ in answers)
        assert codes == {200: 2, 429: 8}, answers
        refusals = {body["error"]["code"] for code, body in answers if code == 429}
        assert refusals == {"RESOURCE_EXHAUSTED"}
        messages = " ".join(body["error"]["message"] for code, body in answers if code == 429)
        assert "GATEWAY_BATCH_MAX_UPLOADS_PER_CALLER" in messages
        kept = stored_bytes(store / "uploads") - sum(
            p.stat().st_size for p in (store / "uploads").glob("*.json")
        )
        assert kept == 2 * 900_000
    # Bytes: many uploads allowed, 2 MiB per caller: at most 2 MiB kept, whatever the race.
    store = store.parent / "store-bytes"
    limits = ("--batch-max-uploads-per-caller=20", f"--batch-max-upload-bytes-per-caller={2 << 20}",
              f"--job-store-max-bytes={4 << 20}")  # fmt: skip
    with two(tfs, store, tmp_path, limits, http=True) as (processes, _):
        urls = [p.http_url for p in processes]
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda i: upload(urls[i % 2], parts), range(10)))
        codes = Counter(code for code, _ in answers)
        assert set(codes) <= {200, 429} and codes[200] <= 2 and codes[429] >= 8, answers
        messages = " ".join(body["error"]["message"] for code, body in answers if code == 429)
        assert "GATEWAY_BATCH_MAX_UPLOAD_BYTES_PER_CALLER" in messages
        images = [
            p for p in (store / "uploads").rglob("*")
            if p.is_file() and p.parent.name != "uploads" and not p.name.startswith(".")
        ]  # fmt: skip
        on_disk = sum(p.stat().st_size for p in images)
        assert on_disk <= 2 << 20
        tally = json.loads((store / "usage.json").read_text())
        records = len(list((store / "uploads").glob("*.json")))  # 4 KiB reserved each
        assert tally["callers"]["anonymous"]["bytes"] == on_disk, (tally, on_disk)
        assert tally["bytes"] == on_disk + records * 4096, (tally, on_disk, records)
