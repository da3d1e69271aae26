"""The local executor's isolation (issue 33 item 1): each job's runner is a child process of
the gateway with its own memory limit. A runner killed (or out of memory) is the runner's
death, not the gateway's: the job is retried, and after GATEWAY_BATCH_RUNNER_MAX_DEATHS deaths
it fails as a poison job naming the cause. A gateway that dies takes no runner with it past
its own end.

TF Serving is reached through tests/support/faultupstream.py holding every Predict, so each
runner is alive and waiting when the test kills it, however fast the machine is.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import signal
import time
from pathlib import Path

import grpc

from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import (
    Client,
    State,
    gateway,
    make_images,
    metadata,
    new_runner,
    runner_pids,
)
from tests.support.localserver import LocalServer


def no_traceback(gw: GatewayProcess) -> None:
    """Nothing the runners went through left a traceback in the log (theirs go there too)."""
    assert not [r for r in gw.records() if "Traceback" in json.dumps(r)]


def record(store: Path, name: str) -> dict[str, object]:
    job_id = name.removeprefix("operations/")
    return dict(json.loads((store / "operations" / f"{job_id}.json").read_text()))


def test_a_job_whose_runner_is_killed_3_times_fails_as_a_poison_job(
    upstream: FaultyUpstream, tmp_path: Path, store: Path
) -> None:
    images = tmp_path / "images"
    make_images(images, 20)
    extra = ["--batch-runner-max-deaths=3"]
    with gateway(upstream, store, tmp_path, extra) as gw, gw.channel() as channel:
        client = Client(channel)
        pid = gw.process.pid
        upstream.hold(after=0)
        name = client.create(input_uri=str(images)).name
        killed: list[int] = []
        for death in range(3):
            runner = new_runner(gw, killed)
            upstream.wait_active(1)  # the runner's first image is in the pipeline
            os.kill(runner, signal.SIGKILL)
            killed.append(runner)
            if death < 2:
                client.until(name, lambda m: m.state == State.RUNNING)
        done = client.wait(name)
        meta = metadata(done)
        assert meta.state == State.FAILED
        assert done.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], done.error
        message = done.error.message
        assert "killed by SIGKILL" in message and "3 times" in message, message
        assert "GATEWAY_BATCH_RUNNER_MAX_DEATHS=3" in message, message
        assert record(store, name)["runner_deaths"] == 3
        # The gateway itself never restarted and still serves online calls.
        upstream.release()
        assert gw.process.poll() is None and gw.process.pid == pid
        assert gw.health() == 1
        assert runner_pids(gw) == []
        no_traceback(gw)


def test_a_runner_out_of_memory_under_its_limit_is_named_as_the_cause(
    tfs: LocalServer, tmp_path: Path, store: Path
) -> None:
    # Lines with 30 MiB images inline (within the image limit): more than a runner with
    # 320 MiB of address space can hold while it reads them.
    data = tmp_path / "data"
    data.mkdir()
    line = json.dumps({"image_bytes": base64.b64encode(bytes(30 << 20)).decode()}) + "\n"
    with gzip.open(data / "big.jsonl.gz", "wt", compresslevel=1) as out:
        for _ in range(12):
            out.write(line)
    extra = ["--batch-runner-memory-bytes=335544320", "--batch-runner-max-deaths=2"]
    with gateway(tfs, store, tmp_path, extra) as gw, gw.channel() as channel:
        client = Client(channel)
        done = client.wait(client.create(input_uri=str(data / "big.jsonl.gz")).name, 300)
        assert metadata(done).state == State.FAILED
        message = done.error.message
        assert done.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message
        assert "ran out of memory" in message and "2 times" in message, message
        assert "GATEWAY_BATCH_RUNNER_MEMORY_BYTES=335544320" in message, message
        assert gw.process.poll() is None and gw.health() == 1
        no_traceback(gw)


def test_a_gateway_killed_mid_job_leaves_no_runner_behind(
    upstream: FaultyUpstream, tmp_path: Path, store: Path
) -> None:
    images = tmp_path / "images"
    make_images(images, 20)
    with gateway(upstream, store, tmp_path) as gw, gw.channel() as channel:
        upstream.hold(after=0)
        Client(channel).create(input_uri=str(images))
        runner = new_runner(gw, [])
        upstream.wait_active(1)
        gw.process.kill()
        gw.process.wait()
        log = gw
    # The runner sees its link to the gateway close, stops and exits.
    deadline = time.monotonic() + 60
    while (
        Path(f"/proc/{runner}").exists()
        and b"gateway.jobs.runner.child" in Path(f"/proc/{runner}/cmdline").read_bytes()
    ):
        stat = Path(f"/proc/{runner}/stat").read_text().split()
        if stat[2] == "Z":
            break  # exited (a zombie until init reaps it)
        assert time.monotonic() < deadline, "the runner outlived its gateway"
        time.sleep(0.05)
    no_traceback(log)
