"""The local executor's isolation: one shard of a job run by the batch runner in a child
process (gateway.jobs.runner.child) with its own memory limit, its images sent back over a socket
and run through this process's pipeline on the batch Lane (gateway.jobs.transports.over_pipe).

Whatever the dataset's files do to the runner (a parser bug, more memory than the limit),
the child dies, not the gateway: `run_shard` raises RunnerDied naming the cause, and the
executor counts the death in the job's record. Every other ending is raised as the runner
raised it (StopJob, ReadError, LimitExceeded, ...), so the executor's rules stay the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from gateway.api.bindings import Binding
from gateway.errors import GatewayError, Kind
from gateway.jobs.runner import job as batch_job
from gateway.jobs.runner import sources
from gateway.jobs.runner.access import Guard
from gateway.jobs.runner.budget import Budget, BudgetSpent
from gateway.jobs.runner.child import MEMORY_EXIT
from gateway.jobs.runner.dataset_limits import ItemCount, LimitExceeded
from gateway.jobs.runner.fence import LOST, LeaseLost
from gateway.jobs.runner.transport import StopJob, Work
from gateway.jobs.spec import JobSpec
from gateway.jobs.transports.in_process import InProcessTransport, Lane
from gateway.jobs.transports.over_pipe import Link, ProtocolError, answer_header, receive

log = logging.getLogger("gateway.jobs")

STOP_GRACE = 10.0  # seconds a stopped runner gets to commit its answered lines
MAX_CHARGES = 8  # a runner's writes waiting for their reservation at once (a few threads)
MEMORY_SETTING = "GATEWAY_BATCH_RUNNER_MEMORY_BYTES"
# Whether the runner may commit now (the job's lease is still this process's).
Holds = Callable[[], Awaitable[float]]  # until when the job's lease is held (0: not)


class RunnerDied(Exception):
    """The runner's process ended without saying how its run ended; `cause` says why (the
    memory limit, a signal, an exit status)."""

    def __init__(self, cause: str, out_of_memory: bool) -> None:
        super().__init__(cause)
        self.cause = cause
        self.out_of_memory = out_of_memory

    def poison(self, deaths: int, limit: int) -> GatewayError:
        """The error of a job whose runner died `deaths` times, the limit: a poison job."""
        return GatewayError(
            Kind.OVERLOADED if self.out_of_memory else Kind.INTERNAL,
            f"{self.cause} {deaths} times; the job is failed as a poison job instead of "
            f"being retried forever (GATEWAY_BATCH_RUNNER_MAX_DEATHS={limit}): look for "
            "inputs that need more memory than the limit, or raise it",
        )


def death(status: int, memory_bytes: int) -> RunnerDied:
    if status == MEMORY_EXIT:
        return RunnerDied(
            f"the batch runner ran out of memory under its limit ({MEMORY_SETTING}={memory_bytes})",
            True,
        )
    if status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else -status
        how = " (the kernel's OOM killer, or an operator)" if -status == signal.SIGKILL else ""
        return RunnerDied(f"the batch runner was killed by {name}{how}", -status == 9)
    return RunnerDied(f"the batch runner exited with status {status} before it finished", False)


class Runner:
    """How the executor starts runner processes: their memory limit and log level."""

    def __init__(self, memory_bytes: int, log_level: str) -> None:
        self.memory_bytes = memory_bytes
        self.log_level = log_level

    async def run_shard(
        self,
        spec: JobSpec,
        binding: Binding,
        lane: Lane,
        concurrency: int,
        shard: int,
        checkpoint_seconds: float,
        guard: Guard | None,
        items: ItemCount,
        owner: str,
        budget: Budget | None = None,
        holds: Holds | None = None,
    ) -> dict[str, Any]:
        """Runs one shard in a child process; its marker's contents, or what the runner
        raised, or RunnerDied. The runner's writes are charged to `budget`, and each commit
        waits for `holds` to say the job's lease is still this process's (else LeaseLost). Its
        images run as `owner` (the job's caller): its quota, fair share and payload log."""
        ours, theirs = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway.jobs.runner.child",
                str(theirs.fileno()),
                str(self.memory_bytes),
                self.log_level,
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                env={**os.environ, "MALLOC_ARENA_MAX": "2"},  # arenas are address space
            )
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        link = Link(reader, writer)
        pipeline = InProcessTransport(spec, binding, lane, concurrency, lambda *_: None, owner)
        calls: dict[str, set[asyncio.Task[None]]] = {"work": set(), "charge": set(), "fence": set()}
        end: dict[str, Any] | None = None
        broken = ""
        max_image = items.limits.max_record_bytes  # a TFRecord image may be this large
        try:
            start = {
                "t": "start",
                "spec": spec.to_json(),
                "shard": shard,
                "checkpoint_seconds": checkpoint_seconds,
                "concurrency": concurrency,
                "guard": guard.urls() if guard is not None else None,
                "fences": guard.fence_urls() if guard is not None else [],
                "limits": asdict(items.limits),
                "items_read": items.read,
                "budget": budget is not None,
                "fence": holds is not None,
            }
            await link.send(start)
            while end is None:
                try:
                    header, data = await receive(reader, max_image)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break  # the runner is gone
                except ProtocolError as e:
                    broken = str(e)
                    break
                kind = str(header.get("t"))
                # A runner has at most `concurrency` images and a few writes waiting for an
                # answer (twice that, for answers whose task has not ended yet); more is a
                # runner that no longer follows the protocol, bounding the gateway's memory.
                waiting = calls.get(kind)
                most = 2 * concurrency if kind == "work" else MAX_CHARGES
                if waiting is not None and len(waiting) >= most:
                    broken = f"more than {most} {kind} frames waiting at once"
                    break
                call = None
                if kind == "work":
                    call = asyncio.create_task(_answer(link, pipeline, header, data))
                elif kind == "charge" and budget is not None:
                    call = asyncio.create_task(_charge(link, budget, header))
                elif kind == "fence" and holds is not None:
                    call = asyncio.create_task(_fence(link, holds, header))
                elif kind == "credit" and budget is not None:
                    budget.release(int(header.get("bytes", 0)))
                elif kind == "end":
                    end = header
                if call is not None and waiting is not None:
                    waiting.add(call)
                    call.add_done_callback(waiting.discard)
        except asyncio.CancelledError:
            await _stop(link, process, budget, holds, max_image)
            raise
        finally:
            for call in (*calls["work"], *calls["charge"], *calls["fence"]):
                call.cancel()
            if broken and process.returncode is None:
                process.kill()
            if process.returncode is None and end is None:
                await _stop(link, process, budget, holds, max_image)
            writer.close()  # the runner reads to the end of the stream, then exits
            status = await process.wait()
        if broken:
            raise RunnerDied(
                f"the batch runner broke its protocol with the gateway ({broken})", False
            )
        if end is None:
            raise death(status, self.memory_bytes)
        items.read = int(end.get("items_read", items.read))
        return _ended(end)


async def _answer(
    link: Link, pipeline: InProcessTransport, header: dict[str, Any], data: bytes
) -> None:
    try:
        found: Any = await pipeline.call(Work(0, data, str(header.get("rid", "")), None))
    except GatewayError as e:
        found = e
    with contextlib.suppress(ConnectionError):
        await link.send({**answer_header(found), "n": header.get("n")})


async def _charge(link: Link, budget: Budget, header: dict[str, Any]) -> None:
    reply: dict[str, Any] = {"t": "charged", "n": header.get("n"), "ok": True}
    try:
        await asyncio.to_thread(budget.reserve, int(header.get("bytes", 0)))
    except BudgetSpent as e:
        reply.update(ok=False, message=str(e))
    with contextlib.suppress(ConnectionError):
        await link.send(reply)


async def _fence(link: Link, holds: Holds, header: dict[str, Any]) -> None:
    until = await holds()
    reply: dict[str, Any] = {"t": "fenced", "n": header.get("n"), "ok": until > 0, "until": until}
    if not until:
        reply["message"] = LOST
    with contextlib.suppress(ConnectionError):
        await link.send(reply)


async def _stop(
    link: Link,
    process: asyncio.subprocess.Process,
    budget: Budget | None,
    holds: Holds | None,
    max_data: int,
) -> None:
    """Asks the runner to stop and answers what it still asks (the reservations and fence
    checks of the lines it commits as it stops; images are refused) until it exits; kills
    it past the grace."""

    async def wind_down() -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await link.send({"t": "stop"})
        while True:
            header, _ = await receive(link.reader, max_data)
            kind = header.get("t")
            if kind == "charge" and budget is not None:
                await _charge(link, budget, header)
            elif kind == "fence" and holds is not None:
                await _fence(link, holds, header)
            elif kind == "credit" and budget is not None:
                budget.release(int(header.get("bytes", 0)))
            elif kind == "work":
                stopping = GatewayError(Kind.CANCELLED, "the job is stopping")
                await link.send({**answer_header(stopping), "n": header.get("n")})
            elif kind == "end":
                return

    with contextlib.suppress(
        TimeoutError, asyncio.IncompleteReadError, ConnectionError, ProtocolError
    ):
        await asyncio.wait_for(wind_down(), STOP_GRACE)
    link.writer.close()  # the runner, its end frame sent, waits for this
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), STOP_GRACE)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def _ended(end: dict[str, Any]) -> dict[str, Any]:
    """The shard's summary, or the runner's exception raised again here."""
    how = end.get("how")
    message = str(end.get("message", ""))
    if how == "done":
        return dict(end["summary"])
    if how == "stopped":
        raise asyncio.CancelledError
    if how == "lost":
        raise LeaseLost(message)
    if how == "stop":
        raise StopJob(Kind(end["kind"]), message)
    if how == "read":
        raise sources.ReadError(message)
    if how == "limit":
        raise LimitExceeded(message)
    if how == "precondition":
        raise batch_job.JobError(message)
    if how == "error":
        raise GatewayError(Kind(end["kind"]), message)
    raise GatewayError(Kind.INTERNAL, f"internal error in the batch runner: {message}")
