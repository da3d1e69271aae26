"""Many short-lived gateway processes, cheaply: a fork server for tests that repeat a race.

Starting `python -m gateway` costs about a second of CPU, nearly all of it imports; a test
that needs 200 gateways would spend minutes on them. The fork server is one process that
imports the gateway once and then forks a child per request. The child runs exactly what
`python -m gateway` runs (`gateway.__main__.main` with the given flags, its own event loop,
gRPC server, signal handlers and exit code); only the imports are inherited. gRPC is never
used in the fork server itself, so nothing of gRPC's state crosses the fork.

Each child logs to its own file; it is told to bind port 0 and the test reads the bound
port from the child's "gateway listening" log line, so no port is guessed in advance.

    with ForkServer() as forks:
        child = forks.start(["--upstream=127.0.0.1:1"], log_path)
        port = child.wait_listening()
        os.kill(child.pid, signal.SIGTERM)
        assert child.wait_exit(60) == 0
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tests.support.localserver import REPO_ROOT, server_env

# Import cost paid once, in the fork server (the same modules `python -m gateway` loads).
_SERVER_SOURCE = r"""
import json, os, signal, sys
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no BLAS threads to lose in the fork
import gateway.__main__

def reap(signum, frame):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        os.write(1, (json.dumps({"exited": pid, "code": code}) + "\n").encode())

signal.signal(signal.SIGCHLD, reap)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdin.close()
        code = 0
        try:
            gateway.__main__.main(request["argv"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.write(1, (json.dumps({"started": pid}) + "\n").encode())
"""

_LISTENING = re.compile(r'"message":"gateway listening",[^\n]*?"address":"[^"]*:(\d+)"')


@dataclass
class Child:
    pid: int
    log_path: Path
    _exited: threading.Event = field(default_factory=threading.Event)
    code: int | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_listening(self, timeout: float = 120.0) -> int:
        """The port the child bound, once it logged that it listens (polls its log)."""
        deadline = time.monotonic() + timeout
        while True:
            match = _LISTENING.search(self.log())
            if match:
                return int(match.group(1))
            if self._exited.is_set():
                raise AssertionError(f"gateway {self.pid} exited ({self.code}):\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway {self.pid} did not listen:\n{self.log()}")
            time.sleep(0.02)

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if the child is still running after `timeout`."""
        self._exited.wait(timeout)
        return self.code


class ForkServer:
    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER_SOURCE],
            cwd=REPO_ROOT,
            env=server_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        self._children: dict[int, Child] = {}
        self._started: list[int] = []
        self._started_event = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for child in list(self._children.values()):
            if not child._exited.is_set():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(30)

    def start(self, argv: list[str], log_path: Path, timeout: float = 60.0) -> Child:
        """Forks a gateway running `python -m gateway <argv>` (pass --port=0)."""
        with self._lock:
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps({"argv": argv, "log": str(log_path)}) + "\n")
            self._process.stdin.flush()
            with self._started_event:
                if not self._started_event.wait_for(lambda: bool(self._started), timeout):
                    raise AssertionError("the fork server did not fork in time")
                pid = self._started.pop(0)
                child = self._children[pid]
            child.log_path = log_path
            return child

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            if "started" in message:
                pid = message["started"]
                with self._started_event:
                    self._children.setdefault(pid, Child(pid, Path()))
                    self._started.append(pid)
                    self._started_event.notify_all()
            elif "exited" in message:
                pid = message["exited"]
                with self._started_event:
                    child = self._children.setdefault(pid, Child(pid, Path()))
                child.code = message["code"]
                child._exited.set()
