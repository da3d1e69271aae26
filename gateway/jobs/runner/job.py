"""One shard of a batch job end to end, and the job-level finalize step.

run_shard: check the job spec against OUTPUT's job.json -> list this shard's output files ->
for each unfinished one, resume after its committed lines -> run them (gateway.jobs.runner.shard,
through a transport) -> _SUCCESS.SSSSS -> the job's summary.json and _SUCCESS when every
shard has its marker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import posixpath
import time
from typing import Any

from gateway.jobs.runner import sources, storage
from gateway.jobs.runner.budget import Budget
from gateway.jobs.runner.dataset_limits import Limits
from gateway.jobs.runner.fence import Fence
from gateway.jobs.runner.output import STATE, Counts, Output, iso, now, shard_marker
from gateway.jobs.runner.shard import Connect, RunSettings, ShardRun, UnitState
from gateway.jobs.runner.sources import Dataset, Guard
from gateway.jobs.spec import JobSpec

# The layout and line format of what a job writes; a job started with another one is not
# resumed (2: results in the .proto field names, job.json holds the JobSpec).
FORMAT_VERSION = 2
JOB_FILE = posixpath.join(STATE, "job.json")


class JobError(Exception):
    """The job cannot start or resume as asked; the message says why."""


def job_description(spec: JobSpec, dataset: Dataset) -> dict[str, Any]:
    """What OUTPUT/_batch/job.json holds: the spec, and the input listing it ran over."""
    listing = json.dumps(dataset.fingerprint()).encode()
    return {
        "format_version": FORMAT_VERSION,
        "spec": spec.to_json(),
        "dataset": {
            "format": dataset.format,
            "files": len(dataset.files),
            "sha256": hashlib.sha256(listing).hexdigest(),
        },
    }


def _shape(description: dict[str, Any]) -> dict[str, Any]:
    """What must match for a run to resume, flattened: everything but where OUTPUT is and
    how the format was named (the dataset's format counts)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            flat[prefix.rstrip(".")] = value

    walk("", description)
    flat.pop("spec.output", None)
    flat.pop("spec.format", None)
    return flat


def check_job(out: Output, expected: dict[str, Any]) -> None:
    """Writes _batch/job.json, or refuses when it exists with another job."""
    if not out.exists(JOB_FILE):
        out.write_json(JOB_FILE, expected)
    stored = out.read_json(JOB_FILE)
    _check_version(out, stored)
    found, wanted = _shape(stored), _shape(expected)
    if found != wanted:
        differences = ", ".join(
            f"{k}: {found.get(k)!r} before, {wanted.get(k)!r} now"
            for k in sorted(set(found) | set(wanted))
            if found.get(k) != wanted.get(k)
        )
        what = "the input files changed" if "dataset.sha256" in differences else ""
        raise JobError(
            f"OUTPUT {out.location.url()} holds a job started with other arguments "
            f"({differences}){'; ' + what if what else ''}. Resume with the same arguments, "
            "or write to a new OUTPUT."
        )


def _check_version(out: Output, stored: dict[str, Any]) -> None:
    if stored.get("format_version") != FORMAT_VERSION:
        raise JobError(
            f"OUTPUT {out.location.url()} holds a job written by another version of the batch "
            f"runner (format {stored.get('format_version', 1)}, this one writes "
            f"{FORMAT_VERSION}); finish it with that version, or write to a new OUTPUT"
        )


def _check_places(dataset: Dataset, out: Output) -> None:
    same_fs = type(dataset.location.fs) is type(out.fs)
    root, target = dataset.location.path.rstrip("/"), out.location.path.rstrip("/")
    if same_fs and (target == root or target.startswith(root + "/")):
        raise JobError(
            f"OUTPUT {out.location.url()} is inside INPUT {dataset.location.url()}: a restart "
            "would read the results as input. Choose an OUTPUT outside INPUT."
        )


def prepare(
    spec: JobSpec,
    guard: Guard | None = None,
    limits: Limits | None = None,
    budget: Budget | None = None,
    fence: Fence | None = None,
) -> tuple[Dataset, Output]:
    """The dataset and OUTPUT of a job, with job.json written or checked (blocking I/O).
    With a guard, the input may only be read where it allows; `limits` bound what is read,
    `budget` what is written, `fence` whether it may be written now."""
    dataset = sources.discover(spec.input, spec.format, guard, limits)
    out = Output(storage.resolve(spec.output), budget, fence)
    _check_places(dataset, out)
    check_job(out, job_description(spec, dataset))
    return dataset, out


async def run_shard(
    spec: JobSpec,
    connect: Connect,
    concurrency: int,
    settings: RunSettings,
    guard: Guard | None = None,
) -> dict[str, Any]:
    """Runs (or resumes) one shard, sending images through the transport `connect` makes;
    returns its marker's contents."""
    dataset, out = await asyncio.to_thread(
        prepare, spec, guard, settings.limits, settings.budget, settings.fence
    )
    index = settings.shard_index
    marker = shard_marker(index)
    if out.exists(marker):
        await asyncio.to_thread(finalize_if_complete, out)
        return dict(out.read_json(marker))
    shard_state = posixpath.join(STATE, f"shard-{index:05d}.json")
    if not out.exists(shard_state):
        await asyncio.to_thread(out.write_json, shard_state, {"started_at": now()})
    first_started = float(out.read_json(shard_state)["started_at"])
    run_started = time.monotonic()
    units = sources.units(dataset, index, spec.shards)
    await asyncio.to_thread(
        out.remove_temporaries, index, [u.name for u in units], spec.shards == 1
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
    shard = ShardRun(connect, concurrency, settings, dataset, out, states)
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
        "shard_count": spec.shards,
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
            "retries": shard.transport.retries,
        },
    }
    await asyncio.to_thread(out.write_json, marker, summary)  # (a budget may block)
    await asyncio.to_thread(finalize_if_complete, out)
    return summary


def finalize_if_complete(out: Output) -> dict[str, Any] | None:
    """Writes summary.json and _SUCCESS once every shard has its marker; else None."""
    try:
        return finalize(out)
    except JobError:
        return None


def finalize(out: Output) -> dict[str, Any]:
    """The job-level summary.json and _SUCCESS; JobError names the shards not finished."""
    if not out.exists(JOB_FILE):
        raise JobError(f"{out.location.url()} holds no batch job (no {JOB_FILE})")
    job = out.read_json(JOB_FILE)
    _check_version(out, job)
    spec = JobSpec.from_json(job["spec"])
    count = spec.shards
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
        "input": spec.input,
        "output": out.location.url(),
        "format": job["dataset"]["format"],
        "task": spec.task,
        "requested_model": spec.model._asdict(),
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
    out.check_fence()
    storage.write_atomic(out.fs, out.path("_SUCCESS"), b"")
    return summary
