"""The batch runner as a child process of the gateway: the local executor runs each shard of
a job here, so reading and parsing untrusted dataset files happens in a process with its own
memory limit, which the kernel may kill without touching online serving.

`python -m gateway.jobs.runner.child FD MEMORY_BYTES LOG_LEVEL`: FD is this process's end of a
socket to the gateway (gateway.jobs.transports.over_pipe); the address space is limited to
MEMORY_BYTES (RLIMIT_AS) and the process is the kernel's first choice when memory runs out
(oom_score_adj 1000). Out of memory, it exits with MEMORY_EXIT; when the gateway goes away,
it stops (committing what is answered) and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import sys
import threading
from typing import Any

from gateway import logs
from gateway.errors import GatewayError
from gateway.jobs.runner import job, sources, storage
from gateway.jobs.runner.access import Guard
from gateway.jobs.runner.dataset_limits import ItemCount, LimitExceeded, Limits
from gateway.jobs.runner.fence import LeaseLost
from gateway.jobs.runner.shard import RunSettings
from gateway.jobs.runner.transport import Deliver, StopJob
from gateway.jobs.spec import JobSpec
from gateway.jobs.transports.over_pipe import (
    Link,
    PipeBudget,
    PipeFence,
    PipeTransport,
    ProtocolError,
    receive,
)

log = logging.getLogger("gateway.jobs")

MEMORY_EXIT = 86  # the exit status that says "out of memory under the limit"
ENDING_GRACE = 10.0  # seconds the runner waits, its end frame sent, for the gateway to close


def _out_of_memory() -> None:
    os._exit(MEMORY_EXIT)  # nothing more can be allocated: no log line, no cleanup


def _from_memory(error: BaseException | None) -> bool:
    """The error is the address space running out (a MemoryError, a thread or a mapping
    that could not be made), or was raised while one was handled (asyncio's own transports
    break in odd ways once an allocation failed)."""
    seen = 0
    while error is not None and seen < 20:
        if isinstance(error, MemoryError):
            return True
        if isinstance(error, RuntimeError) and "can't start new thread" in str(error):
            return True
        if isinstance(error, OSError) and error.errno == errno.ENOMEM:
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def _exit_if_memory(error: BaseException | None) -> None:
    """Out of memory (the error says so, _from_memory): the runner exits with MEMORY_EXIT.
    Also what the link calls when a frame could not be written (it is closed already, so
    nothing sent after can be misread)."""
    if _from_memory(error):
        _out_of_memory()


def limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        _exit_if_memory(args.exc_value)
        threading.__excepthook__(args)

    threading.excepthook = thread_hook


async def serve(fd: int) -> None:
    loop = asyncio.get_running_loop()

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        _exit_if_memory(context.get("exception"))
        loop.default_exception_handler(context)

    loop.set_exception_handler(on_error)
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    link = Link(reader, writer, on_broken=_exit_if_memory)
    try:
        start, _ = await receive(reader, 0)
    except (asyncio.IncompleteReadError, ConnectionError, ProtocolError):
        return  # the gateway went away before it said what to run
    limits = Limits(**start["limits"])
    items = ItemCount(limits, int(start["items_read"]))
    settings = RunSettings(
        shard_index=int(start["shard"]),
        checkpoint_seconds=float(start["checkpoint_seconds"]),
        log_interval=3600.0,
        stop_at_missing=True,
        limits=limits,
        items=items,
        budget=PipeBudget(link, loop) if start.get("budget") else None,
        fence=PipeFence(link, loop) if start.get("fence") else None,
    )
    guard = None
    if start.get("guard") is not None:
        guard = Guard.of(start["guard"], fences=start.get("fences", []))
    concurrency = int(start["concurrency"])
    spec = JobSpec.from_json(start["spec"])

    def connect(deliver: Deliver) -> PipeTransport:
        return PipeTransport(link, concurrency, deliver)

    run = asyncio.create_task(job.run_shard(spec, connect, concurrency, settings, guard))
    listener = asyncio.create_task(_listen(link, run))
    end = await _outcome(run)
    end["items_read"] = items.read
    with contextlib.suppress(ConnectionError):
        await link.send(end)
    # The end frame is the last one: this side's writing ends there, and the runner keeps
    # reading (answers still on their way are dropped) until the gateway closes its side.
    # Closing with the gateway's frames unread would reset the link (ECONNRESET), and the
    # gateway could see the reset before the end frame it has not read yet: a runner that
    # ended well would count as dead.
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()
    await asyncio.wait({listener}, timeout=ENDING_GRACE)
    listener.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await listener
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def _listen(link: Link, run: asyncio.Task[Any]) -> None:
    """Answers for the run's calls; `stop` (or the gateway gone) cancels the run, which
    commits what is answered before it ends."""
    try:
        while True:
            header, _ = await receive(link.reader, 0)
            if header.get("t") == "stop":
                run.cancel()
            else:
                link.reply(header)
    except (asyncio.IncompleteReadError, ConnectionError, ProtocolError):
        link.gone()
        run.cancel()


async def _outcome(run: asyncio.Task[dict[str, Any]]) -> dict[str, Any]:
    """How the run ended, as the `end` frame says it (gateway.jobs.executors.isolated reads it)."""
    try:
        summary = await run
    except asyncio.CancelledError:
        return {"t": "end", "how": "stopped"}
    except LeaseLost as e:  # nothing more was written
        return {"t": "end", "how": "lost", "message": str(e)}
    except StopJob as e:
        return {"t": "end", "how": "stop", "kind": e.kind.value, "message": e.message}
    except sources.ReadError as e:
        return {"t": "end", "how": "read", "message": str(e)}
    except LimitExceeded as e:
        return {"t": "end", "how": "limit", "message": str(e)}
    except (job.JobError, sources.DatasetError, storage.StorageError) as e:
        return {"t": "end", "how": "precondition", "message": str(e)}
    except GatewayError as e:
        return {"t": "end", "how": "error", "kind": e.kind.value, "message": e.message}
    except Exception as e:
        _exit_if_memory(e)
        log.exception("batch runner failed")
        return {"t": "end", "how": "internal", "message": f"{type(e).__name__}: {e}"}
    return {"t": "end", "how": "done", "summary": summary}


def main(argv: list[str]) -> int:
    fd, memory, level = int(argv[0]), int(argv[1]), argv[2]
    logs.setup(level)
    limit_memory(memory)
    try:
        asyncio.run(serve(fd))
    except BaseException as e:
        _exit_if_memory(e)
        if isinstance(e, KeyboardInterrupt):
            return 130
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
