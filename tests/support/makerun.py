"""`make run` itself, as a user starts it, on free ports: for the launcher's tests
(tests/tools) and the tests that run the docs' commands against it.

`start_make_run(models)` runs the Makefile's `run` target (not tools/devrun.py directly) in a
process group of its own, with every port it binds given as a make variable (GATEWAY_PORT,
SERVING_PORT, HTTP_PORT, METRICS_PORT) and MODELS pointing at a copy of the exported
reference models (tests/support/models.py's cache), so `make models` finds them and nothing
is exported again. It yields once make has printed its "ready:" banner (the event, read from
its output as it comes), and stops make with SIGTERM afterwards, the process group killed if
anything of it is left. The `make_run` fixture (session scope, registered by tests/conftest.py)
is one such `make run` shared by the tests that only call it.

`-o .venv/.installed` tells make to take the venv as built: the tests run in it, and the
venv's stamp may be older than pyproject.toml in a fresh checkout (make would reinstall the
venv the test session runs from). `make test` builds the venv before pytest starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import models as model_cache
from tests.support.localserver import (
    HOST,
    START_ATTEMPTS,
    free_port,
    reserve_port,
    server_env,
)

ROOT = Path(__file__).resolve().parents[2]
# The venv's stamp (Makefile STAMP): taken as built, see the module's docstring.
VENV_STAMP = ".venv/.installed"
# Building nothing, `make run` is up in 10-30 s on 2 cores; a loaded machine takes longer.
START_TIMEOUT = 300.0
# devrun gives the gateway and the local server 30 s each to stop.
STOP_TIMEOUT = 90.0
# The banner's first and last lines (tools/devrun.py).
READY = "ready:"
BANNER_END = "Ctrl-C stops"
# What a server prints when another process took its port between the pick and the bind.
_PORT_TAKEN = ("Failed to bind", "Address already in use")


class MakeRunError(RuntimeError):
    """`make run` exited or did not print its banner; the message quotes its output."""


@dataclass
class MakeRun:
    """A running `make run`: make's process (leader of its own process group), its ports,
    its models directory and what it has printed so far."""

    process: subprocess.Popen[bytes]
    gateway_port: int
    serving_port: int
    http_port: int
    metrics_port: int
    models: Path
    log_path: Path
    lines: list[str] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _closed: bool = False

    @property
    def pgid(self) -> int:
        """The process group of make and everything it started."""
        return self.process.pid

    @property
    def target(self) -> str:
        """The gateway's gRPC address."""
        return f"{HOST}:{self.gateway_port}"

    @property
    def http(self) -> str:
        """The gateway's HTTP door (and page)."""
        return f"http://{HOST}:{self.http_port}"

    @property
    def serving_target(self) -> str:
        """The local TF Serving-compatible server's gRPC address."""
        return f"{HOST}:{self.serving_port}"

    @property
    def ports(self) -> dict[str, int]:
        """Every port `make run` binds, by the make variable that sets it."""
        return {
            "GATEWAY_PORT": self.gateway_port,
            "SERVING_PORT": self.serving_port,
            "HTTP_PORT": self.http_port,
            "METRICS_PORT": self.metrics_port,
        }

    @property
    def samples(self) -> dict[str, Path]:
        """The sample images `make run` wrote (<models>/samples/), by file stem."""
        return {p.stem: p for p in sorted((self.models / "samples").glob("*")) if p.is_file()}

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self.lines)

    @property
    def banner(self) -> str:
        """The "ready:" banner: ports, models and the commands to try."""
        text = self.output
        start = text.find(f"\n{READY}\n")
        end = text.find(BANNER_END, start)
        return text[start + 1 : end] if start >= 0 and end >= 0 else ""

    def post(self, path: str, body: bytes, content_type: str = "image/jpeg") -> Any:
        """POSTs `body` to the HTTP door; its JSON answer (HTTPError unless 200)."""
        request = urllib.request.Request(
            self.http + path, data=body, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.log_path.open("ab") as log:
            for raw in iter(self.process.stdout.readline, b""):
                log.write(raw)
                log.flush()
                with self._changed:
                    self.lines.append(raw.decode(errors="replace"))
                    self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float) -> None:
        """Waits until a line of the output starts with `text`; raises MakeRunError when the
        output ends first (make exited) or after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(line.startswith(text) for line in self.lines):
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    why = "exited" if self._closed else f"printed no {text!r} in {timeout:.0f} s"
                    raise MakeRunError(f"make run {why}:\n{''.join(self.lines)[-6000:]}")
                self._changed.wait(remaining)

    def signal(self, sig: int) -> None:
        """Sends `sig` to make alone (`kill -SIG <make's pid>`)."""
        self.process.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        """Sends `sig` to make's process group, as a terminal does on Ctrl-C."""
        os.killpg(self.pgid, sig)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        """Waits for make to exit; its return code (negative: the signal that ended it)."""
        return self.process.wait(timeout)

    def group_alive(self) -> bool:
        """Whether any process of make's process group is left."""
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        return True

    def group(self) -> dict[int, str]:
        """The processes of make's process group (pid -> command line), from /proc."""
        return group_members(self.pgid)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM to make (which passes it on); the group is killed if anything is left."""
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        if self.group_alive():
            os.killpg(self.pgid, signal.SIGKILL)
        self.process.wait()


def group_members(pgid: int) -> dict[int, str]:
    """The processes whose process group is `pgid` (pid -> command line), from /proc."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # exited meanwhile
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
            members[int(entry.name)] = command
    return members


def make_command(ports: dict[str, int], models: Path) -> list[str]:
    """`make run` with the given ports and models directory."""
    variables = [f"{name}={port}" for name, port in ports.items()]
    return ["make", "--no-print-directory", "-o", VENV_STAMP, "run", f"MODELS={models}", *variables]


def models_copy(directory: Path) -> Path:
    """The exported reference models (the test cache) copied into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    return model_cache.copy_to(directory)


def _default_stop_signals() -> None:
    """In make's process, before it runs: SIGHUP and SIGINT as a terminal's job has them."""
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


@contextmanager
def start_make_run(models: Path, timeout: float = START_TIMEOUT) -> Iterator[MakeRun]:
    """Runs `make run MODELS=<models>` on free ports and yields it once its banner is out;
    always stops it. `models` should hold the exported models (models_copy) or make exports
    them there first. A port taken by another process before the server bound it makes
    `make run` fail at start: then it starts again on other ports."""
    for attempt in range(START_ATTEMPTS):
        with ExitStack() as held:
            # gRPC servers and the HTTP door bind with SO_REUSEPORT: those ports stay held
            # here (tests.support.localserver.reserve_port); the others are only found free.
            ports = {
                "GATEWAY_PORT": held.enter_context(reserve_port()),
                "SERVING_PORT": free_port(),
                "HTTP_PORT": held.enter_context(reserve_port()),
                "METRICS_PORT": free_port(),
            }
            log_path = models.parent / f"make-run-{ports['GATEWAY_PORT']}.log"
            process = subprocess.Popen(
                make_command(ports, models),
                cwd=ROOT,
                env={**server_env(), "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, as a terminal gives a job
                # with the stop signals a terminal leaves it, whatever the suite runs under
                # (under `nohup`, SIGHUP is ignored and make would inherit that)
                preexec_fn=_default_stop_signals,
            )
            run = MakeRun(
                process,
                ports["GATEWAY_PORT"],
                ports["SERVING_PORT"],
                ports["HTTP_PORT"],
                ports["METRICS_PORT"],
                models,
                log_path,
            )
            threading.Thread(target=run._read, daemon=True).start()
            try:
                run.wait_for(READY, timeout)
                run.wait_for(BANNER_END, timeout)
            except MakeRunError:
                run.stop()
                if attempt + 1 < START_ATTEMPTS and any(t in run.output for t in _PORT_TAKEN):
                    continue
                raise
            try:
                yield run
            finally:
                run.stop()
            return


@pytest.fixture(scope="session")
def make_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeRun]:
    """One `make run` for the session, on free ports, over a copy of the exported models:
    for tests that call it and change nothing (stopping it is tests/tools' own business)."""
    models = models_copy(tmp_path_factory.mktemp("make-run") / "models")
    with start_make_run(models) as run:
        yield run
