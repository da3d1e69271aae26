"""Runs the local TF Serving-compatible server (`python -m serving.local`) for tests.

Used by the serving tests and by the gateway's end-to-end tests. The server runs as a
subprocess bound to 127.0.0.1 on a free port; its output goes to a log file that failures
quote. TensorFlow is not imported here (only grpc), so gateway tests stay light.

    with run_local_server(["--model_name=detector", f"--model_base_path={path}"]) as tfs:
        channel = grpc.insecure_channel(tfs.target)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

import grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
# Loading both reference models (with warmup) takes ~5 s on 2 cores; leave room for slow CI.
DEFAULT_START_TIMEOUT = 120.0
# SIGTERM gives in-flight RPCs 5 s (serving.local.server); then unloading takes a moment.
DEFAULT_STOP_TIMEOUT = 30.0
_LOG_TAIL_CHARS = 6000
# Large enough for full-HD images as tensor_content and for every detection output.
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
)


class LocalServerError(RuntimeError):
    """The server exited or did not become ready; the message quotes its log."""


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on `host` right now (the OS picks it). Another process can
    take it before the caller binds it: for servers that bind with SO_REUSEPORT (gRPC, the
    gateway's HTTP door) use reserve_port(), which closes that race."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextmanager
def reserve_port(host: str = HOST) -> Iterator[int]:
    """A port held for a server that binds with SO_REUSEPORT, for as long as the block runs.

    The port stays bound here (SO_REUSEPORT, never listening) so the OS gives it to no one
    else, while the server under test binds it too. Without this, two servers handed the same
    "free" port would both bind it and share its connections without an error. A socket that
    does not listen receives no connections, so the server gets every one.
    """
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, 0))
        yield int(sock.getsockname()[1])


@contextmanager
def closed_port(host: str = HOST) -> Iterator[int]:
    """A port that refuses connections, for as long as the block runs: bound here without
    listening, so the OS gives it to no one else (a port merely found free could be taken,
    and answered, by another test's server before the test connects to it)."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        yield int(sock.getsockname()[1])


def server_command(args: Sequence[str]) -> list[str]:
    """The command line that starts the local server with `args`."""
    return [sys.executable, "-m", "serving.local", *args]


def server_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the server: loopback bind, importable repo, unbuffered output."""
    result = dict(os.environ)
    result["TFS_LOCAL_BIND_HOST"] = HOST
    result["PYTHONUNBUFFERED"] = "1"
    python_path = result.get("PYTHONPATH")
    result["PYTHONPATH"] = (
        f"{REPO_ROOT}{os.pathsep}{python_path}" if python_path else str(REPO_ROOT)
    )
    result.update(env or {})
    return result


def stop_process(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM and wait; SIGKILL after `timeout`. Returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


class LocalServer:
    """One local server process on a fixed port; it can be stopped and started again."""

    def __init__(
        self,
        args: Sequence[str],
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
    ) -> None:
        self.args = list(args)
        self.port = port
        self.log_path = log_path
        self.env = server_env(env)
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        """`host:port` for grpc.insecure_channel."""
        return f"{HOST}:{self.port}"

    def channel(self) -> grpc.Channel:
        """A new channel to the server with unlimited message sizes (close it when done)."""
        return grpc.insecure_channel(self.target, options=CHANNEL_OPTIONS)

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        """Starts the process and waits until the port answers (all models AVAILABLE)."""
        if self.running:
            raise LocalServerError(f"the server on port {self.port} is already running")
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(server_command(self.args))}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                server_command(self.args),
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C on pytest does not hit the server twice
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()  # never leave a half-started server behind
            raise

    def wait_ready(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        """Waits until the gRPC port accepts an HTTP/2 connection.

        The server opens its port only after every configured model is AVAILABLE, so a
        ready channel means a ready server.
        """
        deadline = time.monotonic() + timeout
        with self.channel() as channel:
            while True:
                if self.process is None or self.process.poll() is not None:
                    code = None if self.process is None else self.process.returncode
                    raise LocalServerError(
                        f"serving.local exited with code {code}\n{self.log_tail()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LocalServerError(
                        f"serving.local did not open {self.target} within {timeout:.0f} s\n"
                        f"{self.log_tail()}"
                    )
                try:
                    grpc.channel_ready_future(channel).result(timeout=min(0.5, remaining))
                    return
                except grpc.FutureTimeoutError:
                    continue

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); returns the exit code."""
        if self.process is None:
            return None
        return stop_process(self.process, timeout)

    def kill(self) -> None:
        """SIGKILL: the process dies at once, like a crashed or evicted pod."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        """Stops the server (if running) and starts it again on the same port."""
        self.stop()
        self.start(timeout)

    def log_text(self) -> str:
        """Everything the server has written so far (all runs, appended)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self) -> str:
        return f"--- {self.log_path} (tail) ---\n{self.log_text()[-_LOG_TAIL_CHARS:]}"


@contextmanager
def run_local_server(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    *,
    cwd: Path = REPO_ROOT,
    log_dir: Path | None = None,
    port: int | None = None,
) -> Iterator[LocalServer]:
    """Starts `python -m serving.local <args>` and yields it once it serves; always stops it.

    `--port` is added (a free port) unless `args` has one. `env` adds variables to the
    server's environment. Relative paths in `args` resolve against `cwd` (the repository
    root by default). The log is `<log_dir or a temp dir>/serving-local-<port>.log`.
    """
    given = _port_in(args)
    chosen = given is None and port is None
    directory = log_dir if log_dir is not None else Path(tempfile.mkdtemp(prefix="serving-local-"))
    for attempt in range(START_ATTEMPTS if chosen else 1):
        server_port = given if given is not None else port if port is not None else free_port()
        server_args = [*args] if given is not None else [*args, f"--port={server_port}"]
        log_path = directory / f"serving-local-{server_port}.log"
        server = LocalServer(server_args, server_port, log_path, env, cwd)
        try:
            server.start(timeout)
        except LocalServerError:
            server.stop()
            # The server binds without SO_REUSEPORT: a port found free and taken by another
            # test before the bind fails loudly; start again on another one.
            if chosen and attempt + 1 < START_ATTEMPTS and _BIND_FAILED in server.log_text():
                continue
            raise
        try:
            yield server
        finally:
            server.stop()
        return


# Starts tried when a port found free is taken by another test before the server binds it
# (servers that bind without SO_REUSEPORT fail loudly then; tests.support.gatewayproc too).
START_ATTEMPTS = 3
_BIND_FAILED = "Failed to bind"


def run_to_exit(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    *,
    cwd: Path = REPO_ROOT,
) -> subprocess.CompletedProcess[str]:
    """Runs the server with `args` until it exits by itself (flag and startup errors).

    stdout and stderr are merged into `.stdout`. Raises subprocess.TimeoutExpired (after
    killing it) when it is still running after `timeout`.
    """
    return subprocess.run(
        server_command(args),
        cwd=cwd,
        env=server_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def _port_in(args: Sequence[str]) -> int | None:
    """The port given as `--port=N` or `--port N`, if any."""
    for index, arg in enumerate(args):
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
        if arg == "--port" and index + 1 < len(args):
            return int(args[index + 1])
    return None
