"""One shard's run: read its items in order, send them through a transport, put the answers
back in input order, commit them as parts every `checkpoint_seconds`, write each output file
once it is complete (the layout is gateway.jobs.runner.output's)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.api import strings
from gateway.errors import GatewayError, Kind
from gateway.jobs.runner import sources
from gateway.jobs.runner.budget import Budget
from gateway.jobs.runner.dataset_limits import ItemCount, Limits
from gateway.jobs.runner.fence import Fence
from gateway.jobs.runner.output import Counts, Output
from gateway.jobs.runner.report import ProgressReport
from gateway.jobs.runner.sources import Dataset, Item, Unit
from gateway.jobs.runner.transport import Answer, Deliver, StopJob, Transport, Work, failed

Connect = Callable[[Deliver], Transport]
# Image bytes a run holds at once (read, not answered yet). Images may each be as large as
# the image limit, so a count of images in flight alone does not bound memory.
HELD_BYTES = 256 * 1024 * 1024
T = TypeVar("T")
_READ_ERRORS: dict[type[OSError], Kind] = {
    FileNotFoundError: Kind.NOT_FOUND,
    PermissionError: Kind.PERMISSION_DENIED,
}


@dataclass
class RunSettings:
    """How to run (may change between restarts)."""

    shard_index: int = 0
    checkpoint_seconds: float = 2.0
    log_interval: float = 5.0
    read_threads: int = 16
    # Stop (StopJob NOT_FOUND) at the first input that cannot be found, in input order, once
    # the lines before it are committed: jobs over the API fail there, naming it.
    stop_at_missing: bool = False
    # What may be read (runner.dataset_limits), and the manifest lines and TFRecord records
    # read against it: one count for the shards one process runs (None: this run's own).
    limits: Limits = field(default_factory=Limits)
    items: ItemCount | None = None
    # What the run's writes are charged to (gateway.jobs.runner.budget); None: nothing.
    budget: Budget | None = None
    # What the run checks before each commit (gateway.jobs.runner.fence); None: nothing.
    fence: Fence | None = None


@dataclass
class UnitState:
    unit: Unit
    start: int  # first line not committed yet
    parts: list[str]
    counts: Counts  # of the committed lines
    next_index: int = 0  # next line to put in `ready`
    ready: list[bytes] = field(default_factory=list)
    ready_counts: Counts = field(default_factory=Counts)
    # index -> (line, status code, model@version, (source, error message) of a missing input)
    waiting: dict[int, tuple[bytes, str, str | None, tuple[str, str] | None]] = field(
        default_factory=dict
    )
    total: int | None = None  # known once the input is read to its end
    last_commit: float = field(default_factory=time.monotonic)
    finished: bool = False
    size: int = 0
    position: float = 0.0


def _line(item: Item, answer: Answer) -> bytes:
    line: dict[str, Any] = {"id": item.id, "source": item.source, "metadata": item.metadata}
    if answer.error is None:
        line["result"] = answer.result
    else:
        line["error"] = {"code": answer.error.code, "message": answer.error.message}
    return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


async def _whole(write: Coroutine[Any, Any, T]) -> tuple[T, bool]:
    """Awaits a write to OUTPUT to its end even when the run is cancelled meanwhile (the
    write goes on in its thread regardless), so the bookkeeping after it matches what was
    written (else the lines committed as the run stops would get the wrong part name).
    Returns the result and whether the run was cancelled meanwhile (then the caller raises
    CancelledError once its bookkeeping is done)."""
    task = asyncio.ensure_future(write)
    try:
        return await asyncio.shield(task), False
    except asyncio.CancelledError:
        return await task, True


def _take(iterator: Iterator[Item], count: int, max_bytes: int) -> list[Item]:
    batch = []
    size = 0
    for item in iterator:
        batch.append(item)
        size += len(item.data or b"")
        if len(batch) >= count or size >= max_bytes:
            break
    return batch


class Held:
    """Image bytes held, against a limit: `take` waits while it would pass it (one image
    alone always fits)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    async def take(self, size: int) -> None:
        while self.used and self.used + size > self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.used += size

    def give(self, size: int) -> None:
        self.used -= size
        self._freed.set()


class ShardRun:
    def __init__(
        self,
        connect: Connect,
        concurrency: int,
        settings: RunSettings,
        dataset: Dataset,
        out: Output,
        states: list[UnitState],
    ) -> None:
        self.settings = settings
        self.dataset = dataset
        self.out = out
        self.states = states
        self.done = 0
        self.errors = 0
        self.resumed = sum(s.start for s in states)
        # Lines waiting to be written in order are bounded, so one image retried for a long
        # time holds back memory for at most this many answers.
        self.permits = asyncio.Semaphore(max(256, concurrency * 8))
        self.total_bytes = sum(s.size for s in states) or 1
        self.seen = 0
        self.progress = ProgressReport(settings.shard_index, settings.log_interval)
        self.transport = connect(self._deliver)
        self.missing: StopJob | None = None  # the first missing input, with stop_at_missing
        self.halt = asyncio.Event()
        self.pool = ThreadPoolExecutor(settings.read_threads, thread_name_prefix="batch-read")
        self.loading: set[asyncio.Task[None]] = set()
        self.items = settings.items or ItemCount(dataset.limits)
        self.held = Held(HELD_BYTES)

    # --- answers back in order -----------------------------------------------------------

    def _deliver(self, work: Work, answer: Answer) -> None:
        state, item = work.token
        self._record(state, item, answer)

    def _record(self, state: UnitState, item: Item, answer: Answer) -> None:
        if item.index < state.next_index or item.index in state.waiting:
            return  # answered twice (sent again after a stream ended): the first answer stays
        self.held.give(item.held)
        item.held, item.data = 0, None
        code = "OK" if answer.error is None else answer.error.code
        missing = None
        if answer.error is not None and answer.error.kind is Kind.NOT_FOUND:
            missing = (item.source, answer.error.message)
        state.waiting[item.index] = (_line(item, answer), code, answer.model, missing)
        while state.next_index in state.waiting:
            line, code, model, missing = state.waiting.pop(state.next_index)
            if missing is not None and self.settings.stop_at_missing and self.missing is None:
                self.missing = StopJob(
                    Kind.NOT_FOUND,
                    f"input {missing[0]} is missing (it vanished during the run or never "
                    f"existed): {missing[1]}; the job stopped at its first missing input",
                )
                self.halt.set()
            state.ready.append(line)
            state.ready_counts.codes[code] += 1
            if model is not None:
                state.ready_counts.models[model] += 1
            state.next_index += 1
            self.done += 1
            self.errors += code != "OK"
            self.permits.release()

    # --- reading ---------------------------------------------------------------------------

    async def _feed(self) -> None:
        loop = asyncio.get_running_loop()
        seq = 0
        for state in self.states:
            if state.finished:
                continue
            iterator = sources.items(self.dataset, state.unit, state.start, self.items)
            count = state.start
            while True:
                batch = await loop.run_in_executor(self.pool, _take, iterator, 64, HELD_BYTES // 4)
                if not batch:
                    break
                for item in batch:
                    await self.permits.acquire()
                    if item.data is not None:
                        item.held = len(item.data)
                    elif item.load is not None and item.error is None:
                        item.held = self.dataset.limits.max_image_bytes  # at most this
                    await self.held.take(item.held)
                    seq += 1
                    count += 1
                    self.seen += 1
                    state.position = item.position
                    if item.error is not None:
                        self._record(state, item, failed(item.error))
                    elif item.data is not None:
                        self._submit(seq, state, item, item.data)
                    else:
                        task = asyncio.create_task(self._load(seq, state, item))
                        self.loading.add(task)
                        task.add_done_callback(self.loading.discard)
            state.total = count
            state.position = 1.0
        await asyncio.gather(*self.loading)
        self.transport.drain()

    async def _load(self, seq: int, state: UnitState, item: Item) -> None:
        assert item.load is not None
        try:
            data = await asyncio.get_running_loop().run_in_executor(self.pool, item.load)
            self.held.give(item.held - len(data))
            item.held = len(data)
        except GatewayError as e:  # refused before reading (a path outside the allowed ones)
            self._record(state, item, failed(e))
            return
        except OSError as e:
            kind = _READ_ERRORS.get(type(e), Kind.UNAVAILABLE)
            self._record(state, item, failed(GatewayError(kind, f"cannot read the image: {e}")))
            return
        self._submit(seq, state, item, data)

    def _submit(self, seq: int, state: UnitState, item: Item, data: bytes) -> None:
        # Named after its output line; the doors take it (gateway.api.strings' rule).
        request_id = strings.numbered(state.unit.name, item.index)
        self.transport.submit(Work(seq, data, request_id, (state, item)))

    # --- writing ---------------------------------------------------------------------------

    async def _commit(self, state: UnitState, force: bool) -> None:
        due = time.monotonic() - state.last_commit >= self.settings.checkpoint_seconds
        cancelled = False
        if state.ready and (force or due or len(state.ready) >= 20000):
            lines, counts = state.ready, state.ready_counts
            state.ready, state.ready_counts = [], Counts()
            path, cancelled = await _whole(
                asyncio.to_thread(self.out.commit_part, state.unit.name, state.start, lines, counts)
            )
            state.parts.append(path)
            state.counts.add(counts)
            state.start += len(lines)
            state.last_commit = time.monotonic()
        complete = state.total is not None and state.start == state.total
        if not cancelled and complete and not state.finished:
            _, cancelled = await _whole(
                asyncio.to_thread(self.out.finish_unit, state.unit.name, state.parts, state.counts)
            )
            state.finished = True
        if cancelled:
            raise asyncio.CancelledError

    def _estimate(self) -> int | None:
        """This run's expected lines, from how much of the shard's input is read."""
        covered = 0.0
        for state in self.states:
            if state.total is not None:
                covered += state.size
            else:
                covered += state.size * state.position
                break
        if covered <= 0:
            return None
        if all(s.total is not None for s in self.states):
            return self.done + sum(
                (s.total or 0) - s.next_index for s in self.states if not s.finished
            )
        return round(self.seen * self.total_bytes / covered)

    async def _writer(self) -> None:
        while True:
            everything_read = all(s.total is not None for s in self.states)
            for state in self.states:
                if not state.finished:
                    await self._commit(state, force=everything_read and state.total is not None)
            self.progress.update(self.done, self.errors, self._estimate(), self.resumed)
            if all(s.finished for s in self.states):
                return
            await asyncio.sleep(0.1)

    async def run(self) -> None:
        self.transport.start()
        feeder = asyncio.create_task(self._feed())
        writer = asyncio.create_task(self._writer())
        fatal = asyncio.create_task(self.transport.stopped.wait())
        halted = asyncio.create_task(self.halt.wait())
        try:
            pending = {feeder, writer, fatal, halted}
            while writer in pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    if task is fatal:
                        self.transport.check()
                    elif task is halted and self.missing is not None:
                        raise self.missing
                    elif task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            await self.transport.close()
        finally:
            tasks = (feeder, writer, fatal, halted, *self.loading)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.transport.abort()
            # Lines answered but not committed yet are kept: commit them before leaving.
            for state in self.states:
                if state.ready and not state.finished:
                    await self._commit(state, force=True)
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.progress.close()
