"""The servers bench.peers measures, as processes: each in its own session (stopped as a
group), its output in a log; the CPU seconds and RSS of its process tree from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from bench.processes import ROOT


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float

    def tree(self) -> list[int]:
        """The process and all its descendants (MLServer's worker, its resource tracker)."""
        found, todo = [], [self.popen.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with suppress(OSError):
                    todo += [int(c) for c in (task / "children").read_text().split()]
        return found

    def cpu_seconds(self) -> float:
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.tree():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / ticks

    def rss_mib(self) -> float:
        total = 0
        for pid in self.tree():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{tail}")


@contextmanager
def process(name: str, command: Sequence[str], tmp: Path, **env: str) -> Iterator[Process]:
    """A server in its own session (stopped as a group: MLServer's worker goes with it),
    its output in a log shown when it fails."""
    log = tmp / f"{name.replace(' ', '-')}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
    try:
        yield Process(name, popen, log, time.perf_counter())
    finally:
        _stop_group(popen)


def _stop_group(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        os.killpg(popen.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            popen.wait(30)
    with suppress(ProcessLookupError):  # whatever of the group is left (a worker, a tracker)
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()
