"""The batch runner's process (gateway.jobs.runner.child) at the end of its run: its end frame is
the last thing it writes, and it reads what the gateway still sends until the gateway closes the
link, so it never exits with the gateway's frames unread (which resets the link, and a reset can
reach the gateway's reader before the end frame it has not taken yet)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gateway.jobs.runner.dataset_limits import Limits
from gateway.jobs.spec import JobSpec
from gateway.jobs.transports.over_pipe import pack

HEAD = struct.Struct("<II")


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the runner closed the link before the whole frame"
        data += chunk
    return data


def read_frame(sock: socket.socket) -> dict[str, Any]:
    size, data_size = HEAD.unpack(read_exactly(sock, HEAD.size))
    header: dict[str, Any] = json.loads(read_exactly(sock, size))
    read_exactly(sock, data_size)
    return header


def test_the_runner_reads_until_the_gateway_closes_and_leaves_nothing_unread(
    tmp_path: Path,
) -> None:
    ours, theirs = socket.socketpair()
    ours.settimeout(60)
    argv = [sys.executable, "-m", "gateway.jobs.runner.child", str(theirs.fileno())]
    runner = subprocess.Popen(
        [*argv, str(2**32), "INFO"],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    theirs.close()
    try:
        # A job whose input is not there: the run ends at once, and says so.
        spec = JobSpec(str(tmp_path / "nothing-here"), str(tmp_path / "out"), "detection")
        start = {
            "t": "start",
            "spec": spec.to_json(),
            "shard": 0,
            "checkpoint_seconds": 1.0,
            "concurrency": 1,
            "guard": None,
            "fences": [],
            "limits": asdict(Limits()),
            "items_read": 0,
            "budget": False,
            "fence": False,
        }
        ours.sendall(pack(start))
        end = read_frame(ours)
        assert end["t"] == "end" and end["how"] in ("read", "precondition"), end
        assert "nothing-here" in end["message"]
        # The gateway's answers to calls the run no longer waits for, after its end: the runner
        # reads and drops them (a runner gone already would refuse them: EPIPE).
        late = pack({"t": "answer", "n": 10**9, "result": {"detections": []}})
        ours.sendall(late * 2000)
        assert runner.poll() is None  # still there, reading, until the gateway closes
        ours.shutdown(socket.SHUT_WR)
        # Nothing of ours was left unread: the end of the stream, not ECONNRESET.
        assert ours.recv(1) == b""
        assert runner.wait(timeout=60) == 0
    finally:
        ours.close()
        if runner.poll() is None:
            runner.kill()
        _, stderr = runner.communicate()
    assert b"Traceback" not in stderr, stderr.decode(errors="replace")
