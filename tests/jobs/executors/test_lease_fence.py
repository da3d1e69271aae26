"""A holder that lost its job's lease writes nothing more (issue 33 item 5): its runner
checks the lease in the store before each commit (gateway.jobs.runner.fence,
gateway.jobs.executors.held).

Two gateway processes share one store, TF Serving behind a proxy that holds calls. The first
runs the job and is paused (SIGSTOP: a paused VM, a long GC) with images in flight; its
lease passes to the second, which resumes the job and is paused in turn with its own images
held. Then TF Serving answers everything and the first resumes with answered lines to commit:
it stops without writing a byte into the job's output, and the second finishes the job with
every input exactly once."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, State, gateway, make_images, metadata, ran, runner_pids
from tests.support.waiting import wait_for

COUNT = 200
PASSES = 40  # images TF Serving answers before it holds the rest


@contextmanager
def paused(gw: GatewayProcess) -> Iterator[None]:
    """The gateway process (not its runners) stopped until the block ends."""
    os.kill(gw.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(gw.process.pid, signal.SIGCONT)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def lost(gw: GatewayProcess, name: str) -> bool:
    return any(
        str(r.get("message", "")).startswith("batch job lease lost")
        and r.get("operation") in (name, name.removeprefix("operations/"))
        for r in gw.records()
    )


def test_a_holder_that_lost_its_lease_commits_nothing_more(
    upstream: FaultyUpstream, tmp_path: Path, store: Path
) -> None:
    images = tmp_path / "images"
    make_images(images, COUNT)
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    upstream.hold(after=PASSES)
    # The first holder's lease expires 3 s after it is paused; the second's outlives the test.
    with gateway(upstream, store, tmp_path / "a", ["--job-lease-seconds=3"]) as first:
        with first.channel() as c1:
            name = Client(c1).create(input_uri=str(images)).name
            # Every image let through is answered; the ones after them are held.
            wait_for(
                lambda: (
                    upstream.calls["Predict"] > PASSES
                    and upstream.active == upstream.calls["Predict"] - PASSES
                ),
                "the first holder's images held upstream",
            )
            Client(c1).until(name, lambda m: m.processed > 0)
            assert ran(first, name)
            output = Path(metadata(Client(c1).get(name)).output_uri)
        with paused(first):
            at_pause = upstream.calls["Predict"]
            with gateway(upstream, store, tmp_path / "b", ["--job-lease-seconds=60"]) as second:
                wait_for(lambda: ran(second, name), "the second process taking the job")
                wait_for(
                    lambda: upstream.calls["Predict"] > at_pause, "the second holder's images held"
                )
                with paused(second):
                    before = snapshot(output)
                    upstream.release()
                    wait_for(lambda: upstream.active == 0, "TF Serving answering every call")
                    os.kill(first.process.pid, signal.SIGCONT)  # resumes with answers to commit
                    wait_for(lambda: lost(first, name), "the first holder seeing its lease lost")
                    wait_for(lambda: not runner_pids(first), "the first holder's runner ending")
                    assert snapshot(output) == before, "a holder without its lease wrote"
                with second.channel() as c2:
                    two = Client(c2)
                    done = two.wait(name)
                    meta = metadata(done)
                    assert meta.state == State.SUCCEEDED, done.error
                    assert (meta.total, meta.processed, meta.failed) == (COUNT, COUNT, 0)
                    ids = [x.id for x in two.lines(name)]
                    assert ids == sorted(p.name for p in images.iterdir())
                    assert max(Counter(ids).values()) == 1
