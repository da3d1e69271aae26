"""One shard of a batch job end to end, and the job-level finalize step.

run_shard: check the arguments against OUTPUT's job.json -> list this shard's output files ->
for each unfinished one, resume after its committed lines -> read items (a thread), load
image bytes (a thread pool), send them (runner.Dispatcher) -> put answers back in input
order -> commit a part every `checkpoint_seconds` -> write the output file when complete ->
_SUCCESS.SSSSS -> job summary.json and _SUCCESS when every shard has its marker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import posixpath
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from google.protobuf import json_format

from gateway.batch import runner, sources, storage
from gateway.batch.output import STATE, Counts, Output, iso, now, shard_marker
from gateway.batch.progress import Progress
from gateway.batch.sources import Dataset, Item, Unit

FORMAT_VERSION = 1


class JobError(Exception):
    """The job cannot start or resume as asked; the message says why."""


@dataclass(frozen=True)
class JobArgs:
    """Everything that shapes the output: a resumed run must give the same."""

    input: str
    output: str
    format: str = "auto"
    task: str = runner.DETECT
    model: str = ""
    version: int | None = None
    label: str | None = None
    min_score: float = 0.0
    max_detections: int = 0
    top_k: int = 0
    shard_count: int = 1


@dataclass
class RunSettings:
    """How to run (may change between restarts)."""

    shard_index: int = 0
    checkpoint_seconds: float = 2.0
    log_interval: float = 5.0
    read_threads: int = 16


@dataclass
class UnitState:
    unit: Unit
    start: int  # first line not committed yet
    parts: list[str]
    counts: Counts  # of the committed lines
    next_index: int = 0  # next line to put in `ready`
    ready: list[bytes] = field(default_factory=list)
    ready_counts: Counts = field(default_factory=Counts)
    waiting: dict[int, tuple[bytes, str, str | None]] = field(default_factory=dict)
    total: int | None = None  # known once the input is read to its end
    last_commit: float = field(default_factory=time.monotonic)
    finished: bool = False
    size: int = 0
    position: float = 0.0


def job_description(args: JobArgs, dataset: Dataset) -> dict[str, Any]:
    listing = json.dumps(dataset.fingerprint()).encode()
    description = asdict(args)
    description.pop("output")
    description["format"] = dataset.format
    description["format_version"] = FORMAT_VERSION
    description["dataset_files"] = len(dataset.files)
    description["dataset_sha256"] = hashlib.sha256(listing).hexdigest()
    return description


def check_job(out: Output, expected: dict[str, Any]) -> None:
    """Writes _batch/job.json, or refuses when it exists with other arguments."""
    path = posixpath.join(STATE, "job.json")
    if not out.exists(path):
        out.write_json(path, expected)
    found = out.read_json(path)
    if found != expected:
        differences = ", ".join(
            f"{k}: {found.get(k)!r} before, {expected.get(k)!r} now"
            for k in sorted(set(found) | set(expected))
            if found.get(k) != expected.get(k)
        )
        what = "the input files changed" if "dataset_sha256" in differences else ""
        raise JobError(
            f"OUTPUT {out.location.url()} holds a job started with other arguments "
            f"({differences}){'; ' + what if what else ''}. Resume with the same arguments, "
            "or write to a new OUTPUT."
        )


def _check_places(dataset: Dataset, out: Output) -> None:
    same_fs = type(dataset.location.fs) is type(out.fs)
    root, target = dataset.location.path.rstrip("/"), out.location.path.rstrip("/")
    if same_fs and (target == root or target.startswith(root + "/")):
        raise JobError(
            f"OUTPUT {out.location.url()} is inside INPUT {dataset.location.url()}: a restart "
            "would read the results as input. Choose an OUTPUT outside INPUT."
        )


def _line(item: Item, result: Any, error: tuple[str, str] | None) -> bytes:
    line: dict[str, Any] = {"id": item.id, "source": item.source, "metadata": item.metadata}
    if result is not None:
        line["result"] = json_format.MessageToDict(
            result, always_print_fields_with_no_presence=True
        )
    else:
        assert error is not None
        line["error"] = {"code": error[0], "message": error[1]}
    return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _take(iterator: Iterator[Item], count: int) -> list[Item]:
    batch = []
    for item in iterator:
        batch.append(item)
        if len(batch) >= count:
            break
    return batch


class ShardRun:
    def __init__(
        self,
        args: JobArgs,
        options: runner.Options,
        settings: RunSettings,
        dataset: Dataset,
        out: Output,
        states: list[UnitState],
    ) -> None:
        self.args = args
        self.options = options
        self.settings = settings
        self.dataset = dataset
        self.out = out
        self.states = states
        self.done = 0
        self.errors = 0
        self.resumed = sum(s.start for s in states)
        # Lines waiting to be written in order are bounded, so one image retried for a long
        # time holds back memory for at most this many answers.
        self.permits = asyncio.Semaphore(max(256, options.concurrency * 8))
        self.total_bytes = sum(s.size for s in states) or 1
        self.seen = 0
        self.progress = Progress(settings.shard_index, settings.log_interval)
        self.dispatcher = runner.Dispatcher(options, self._deliver)
        self.pool = ThreadPoolExecutor(settings.read_threads, thread_name_prefix="batch-read")
        self.loading: set[asyncio.Task[None]] = set()

    # --- answers back in order -----------------------------------------------------------

    def _deliver(self, work: runner.Work, result: Any, error: tuple[str, str] | None) -> None:
        state, item = work.token
        self._record(state, item, result, error)

    def _record(
        self, state: UnitState, item: Item, result: Any, error: tuple[str, str] | None
    ) -> None:
        if item.index < state.next_index or item.index in state.waiting:
            return  # answered twice (sent again after a stream ended): the first answer stays
        code = "OK" if error is None else error[0]
        model = f"{result.model.name}@{result.model.version}" if result is not None else None
        state.waiting[item.index] = (_line(item, result, error), code, model)
        while state.next_index in state.waiting:
            line, code, model = state.waiting.pop(state.next_index)
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
            iterator = sources.items(self.dataset, state.unit, state.start)
            count = state.start
            while True:
                batch = await loop.run_in_executor(self.pool, _take, iterator, 64)
                if not batch:
                    break
                for item in batch:
                    await self.permits.acquire()
                    seq += 1
                    count += 1
                    self.seen += 1
                    state.position = item.position
                    if item.error is not None:
                        self._record(state, item, None, item.error)
                    elif item.data is not None:
                        self._submit(seq, state, item, item.data)
                    else:
                        task = asyncio.create_task(self._load(seq, state, item))
                        self.loading.add(task)
                        task.add_done_callback(self.loading.discard)
            state.total = count
            state.position = 1.0
        await asyncio.gather(*self.loading)
        self.dispatcher.drain()

    async def _load(self, seq: int, state: UnitState, item: Item) -> None:
        assert item.load is not None
        try:
            data = await asyncio.get_running_loop().run_in_executor(self.pool, item.load)
        except FileNotFoundError as e:
            self._record(state, item, None, ("NOT_FOUND", f"cannot read the image: {e}"))
            return
        except PermissionError as e:
            self._record(state, item, None, ("PERMISSION_DENIED", f"cannot read the image: {e}"))
            return
        except OSError as e:
            self._record(state, item, None, ("UNKNOWN", f"cannot read the image: {e}"))
            return
        self._submit(seq, state, item, data)

    def _submit(self, seq: int, state: UnitState, item: Item, data: bytes) -> None:
        request_id = f"{state.unit.name}:{item.index}"
        self.dispatcher.submit(runner.Work(seq, data, request_id, (state, item)))

    # --- writing ---------------------------------------------------------------------------

    async def _commit(self, state: UnitState, force: bool) -> None:
        due = time.monotonic() - state.last_commit >= self.settings.checkpoint_seconds
        if state.ready and (force or due or len(state.ready) >= 20000):
            lines, counts = state.ready, state.ready_counts
            state.ready, state.ready_counts = [], Counts()
            path = await asyncio.to_thread(
                self.out.commit_part, state.unit.name, state.start, lines, counts
            )
            state.parts.append(path)
            state.counts.add(counts)
            state.start += len(lines)
            state.last_commit = time.monotonic()
        if state.total is not None and state.start == state.total and not state.finished:
            await asyncio.to_thread(
                self.out.finish_unit, state.unit.name, state.parts, state.counts
            )
            state.finished = True

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
        self.dispatcher.start()
        feeder = asyncio.create_task(self._feed())
        writer = asyncio.create_task(self._writer())
        fatal = asyncio.create_task(self.dispatcher.stopped.wait())
        try:
            pending = {feeder, writer, fatal}
            while writer in pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    if task is fatal:
                        self.dispatcher.check()
                    elif task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            await self.dispatcher.close()
        finally:
            for task in (feeder, writer, fatal, *self.loading):
                task.cancel()
            await asyncio.gather(feeder, writer, fatal, *self.loading, return_exceptions=True)
            await self.dispatcher.abort()
            # Lines answered but not committed yet are kept: commit them before leaving.
            for state in self.states:
                if state.ready and not state.finished:
                    await self._commit(state, force=True)
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.progress.close()


def prepare(args: JobArgs, settings: RunSettings) -> tuple[Dataset, Output]:
    dataset = sources.discover(args.input, args.format)
    out = Output(storage.resolve(args.output))
    _check_places(dataset, out)
    check_job(out, job_description(args, dataset))
    return dataset, out


async def run_shard(
    args: JobArgs, options: runner.Options, settings: RunSettings
) -> dict[str, Any]:
    """Runs (or resumes) one shard; returns its marker's contents."""
    dataset, out = prepare(args, settings)
    index = settings.shard_index
    marker = shard_marker(index)
    if out.exists(marker):
        finalize_if_complete(out)
        return dict(out.read_json(marker))
    shard_state = posixpath.join(STATE, f"shard-{index:05d}.json")
    if not out.exists(shard_state):
        out.write_json(shard_state, {"started_at": now()})
    first_started = float(out.read_json(shard_state)["started_at"])
    run_started = time.monotonic()
    units = sources.units(dataset, index, args.shard_count)
    await asyncio.to_thread(
        out.remove_temporaries, index, [u.name for u in units], args.shard_count == 1
    )
    states = []
    for unit in units:
        done = await asyncio.to_thread(out.unit_done, unit.name)
        size = sum(f.size for f in unit.files)
        if done is not None:
            await asyncio.to_thread(out.clean_unit, unit.name)
            state = UnitState(unit, done.total, [], done, done.total, total=done.total, size=size)
            state.finished = True
        else:
            start, parts, counts = await asyncio.to_thread(out.resume_point, unit.name)
            state = UnitState(unit, start, parts, counts, next_index=start, size=size)
        states.append(state)
    shard = ShardRun(args, options, settings, dataset, out, states)
    try:
        await shard.run()
    finally:
        shard.progress.log(shard.done, shard.errors, shard._estimate(), shard.resumed, "stopped")
    counts = Counts()
    for state in states:
        counts.add(state.counts)
    seconds = time.monotonic() - run_started
    finished = now()
    summary = {
        "shard": index,
        "shard_count": args.shard_count,
        "outputs": [s.unit.name for s in states],
        "images": counts.total,
        "errors": counts.total - counts.codes.get("OK", 0),
        **counts.to_json(),
        "started_at": iso(first_started),
        "finished_at": iso(finished),
        "started_epoch": first_started,
        "finished_epoch": finished,
        "wall_seconds": round(finished - first_started, 3),
        "this_run": {
            "images": shard.done,
            "resumed_after": shard.resumed,
            "seconds": round(seconds, 3),
            "images_per_second": round(shard.done / seconds, 1) if seconds > 0 else None,
            "retries": shard.dispatcher.retries,
        },
    }
    out.write_json(marker, summary)
    finalize_if_complete(out)
    return summary


def finalize_if_complete(out: Output) -> dict[str, Any] | None:
    """Writes summary.json and _SUCCESS once every shard has its marker; else None."""
    try:
        return finalize(out)
    except JobError:
        return None


def finalize(out: Output) -> dict[str, Any]:
    """The job-level summary.json and _SUCCESS; JobError names the shards not finished."""
    job_path = posixpath.join(STATE, "job.json")
    if not out.exists(job_path):
        raise JobError(f"{out.location.url()} holds no batch job (no {job_path})")
    job = out.read_json(job_path)
    count = int(job["shard_count"])
    missing = [i for i in range(count) if not out.exists(shard_marker(i))]
    if missing:
        shown = ", ".join(str(i) for i in missing[:20]) + (" ..." if len(missing) > 20 else "")
        raise JobError(
            f"{len(missing)} of {count} shards have not finished (no _SUCCESS.SSSSS for shard "
            f"{shown}); run them (same arguments, --shard-index I) and finalize again"
        )
    shards = [out.read_json(shard_marker(i)) for i in range(count)]
    counts = Counts()
    for shard in shards:
        counts.add(Counts.from_json(shard))
    started = min(float(shard["started_epoch"]) for shard in shards)
    finished = max(float(shard["finished_epoch"]) for shard in shards)
    wall = round(finished - started, 3)
    served = []
    for key, images in sorted(counts.models.items()):
        name, _, version = key.rpartition("@")
        served.append({"model": name, "version": int(version), "images": images})
    summary = {
        "input": job["input"],
        "output": out.location.url(),
        "format": job["format"],
        "task": job["task"],
        "requested_model": {"name": job["model"], "version": job["version"], "label": job["label"]},
        "shards": count,
        "images": counts.total,
        "errors": counts.total - counts.codes.get("OK", 0),
        "codes": dict(sorted(counts.codes.items())),
        "served_by": served,
        "started_at": iso(started),
        "finished_at": iso(finished),
        "wall_seconds": wall,
        "images_per_second": round(counts.total / wall, 1) if wall > 0 else None,
        "outputs": [name for shard in shards for name in shard["outputs"]],
        "per_shard": [
            {k: shard[k] for k in ("shard", "images", "errors", "wall_seconds", "this_run")}
            for shard in shards
        ],
    }
    out.write_json("summary.json", summary)
    storage.write_atomic(out.fs, out.path("_SUCCESS"), b"")
    return summary
