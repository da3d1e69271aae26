"""`make run` stops cleanly on Ctrl-C (SIGINT to its process group, as a terminal sends it),
and on SIGTERM or SIGHUP sent to make alone: make exits by the signal, no process of its
group is left (the local TF Serving, the gateway, devrun) and every port it bound is free.

make passes only SIGTERM on to its recipe; on SIGHUP (or SIGINT) to make alone, devrun learns
it from make deleting the lease file it watches (Makefile `run`, tools/devrun.py).
"""

from __future__ import annotations

import signal
import socket
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.localserver import HOST
from tests.support.makerun import models_copy, start_make_run

pytestmark = pytest.mark.slow

# How each signal reaches make run: to the process group (a terminal's Ctrl-C) or to make.
HOW = {
    "ctrl-c": (signal.SIGINT, True),
    "sigterm": (signal.SIGTERM, False),
    "sighup": (signal.SIGHUP, False),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models_copy(tmp_path_factory.mktemp("make-run-signals") / "models")


def bindable(port: int) -> bool:
    """Whether a server could listen on `port` now (a listener still holding it says no;
    connections left in TIME_WAIT do not, as for any server binding with SO_REUSEADDR)."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
            sock.listen()
        except OSError:
            return False
        return True


@pytest.mark.parametrize("how", list(HOW))
def test_make_run_stops(models: Path, how: str) -> None:
    sig, to_group = HOW[how]
    with start_make_run(models) as run:
        members = " ".join(run.group().values())
        for server in ("-m tools.devrun", "-m serving.local", "-m gateway"):
            assert server in members, f"{server} is not in make's process group: {members}"
        lease = next(models.glob(f".make-run-{run.gateway_port}.lease"))
        if to_group:
            run.signal_group(sig)
        else:
            run.signal(sig)
        code = run.wait()
        # make waits for devrun, devrun for both servers: nothing is left once make is gone.
        assert run.group() == {}
        assert not run.group_alive()
        assert code == -sig, run.output[-4000:]
        assert not lease.exists()
        assert "stopping (" in run.output
        assert "Traceback" not in run.output, run.output[-4000:]
        ports = run.ports
    assert {name: port for name, port in ports.items() if not bindable(port)} == {}
