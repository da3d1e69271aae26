"""Batch jobs, transport-neutral: create (with every check that can fail at once), follow,
cancel, delete, upload images, read results. The gRPC servicers only convert.

Errors are JobError with a canonical status name (google.rpc.Code) and a message a person can
act on; the gRPC door maps the name to its code.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.batch import job as batch_job
from gateway.batch import runner, sources, storage
from gateway.batch.output import Output
from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.errors import GatewayError
from gateway.jobs import progress
from gateway.jobs.store import (
    CANCELLED,
    CANCELLING,
    FAILED,
    QUEUED,
    RUNNING,
    STATES,
    SUCCEEDED,
    TERMINAL,
    Job,
    JobStore,
    new_id,
)
from gateway.modelref import ModelRef
from gateway.upstream.client import TFServingClient

log = logging.getLogger("gateway.jobs")

TASK_NAMES = {"detect": "detection", "classify": "classification"}
MAX_REQUEST_ID = 64
MAX_SHARDS = 1000
DEFAULT_PAGE = 50
MAX_PAGE = 1000
_UPLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
CANCELLED_CODE = 1  # google.rpc.Code.CANCELLED


class JobError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _from_gateway(error: GatewayError) -> JobError:
    return JobError(error.code, error.message)


@dataclass(frozen=True)
class CreateParams:
    input_uri: str = ""
    upload_id: str = ""
    output_uri: str = ""
    task: str = runner.DETECT
    model: ModelRef = field(default_factory=lambda: ModelRef(""))
    min_score: float = 0.0
    max_detections: int = 0
    top_k: int = 0
    shards: int = 0
    request_id: str = ""


@dataclass(frozen=True)
class ShardView:
    index: int
    processed: int
    failed: int
    done: bool


@dataclass(frozen=True)
class JobView:
    """A job with its counts, as an Operation shows it."""

    job: Job
    total: int
    processed: int
    failed: int
    shards: list[ShardView]


class Executor(Protocol):
    name: str

    async def start(self, jobs: list[Job]) -> None: ...

    async def submit(self, job: Job) -> None: ...

    async def cancel(self, job: Job) -> None: ...

    async def delete(self, job: Job) -> None: ...

    async def refresh(self, job: Job) -> Job: ...

    async def close(self) -> None: ...


def view(job: Job, found: progress.Progress | None) -> JobView:
    if found is None:
        final = job.final or {}
        shards = [ShardView(i, *s) for i, s in enumerate(final.get("shards", []))]
        return JobView(
            job,
            int(final.get("total", job.total or 0)),
            int(final.get("processed", 0)),
            int(final.get("failed", 0)),
            shards,
        )
    shards = [ShardView(i, *found.shard(i), found.shards_done[i]) for i in range(job.shards)]
    total = job.total or 0
    if all(found.shards_done) or job.state == SUCCEEDED:
        total = found.processed
    return JobView(job, max(total, found.processed), found.processed, found.failed, shards)


def freeze(job: Job, found: progress.Progress) -> None:
    """Keeps the counts in the record once the job has ended."""
    v = view(job, found)
    job.final = {
        "total": v.total,
        "processed": v.processed,
        "failed": v.failed,
        "shards": [[s.processed, s.failed, s.done] for s in v.shards],
        "codes": dict(sorted(found.codes.items())),
    }


class JobService:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        pipeline: Pipeline,
        client: TFServingClient,
        executor_factory: Callable[[JobService], Executor],
    ) -> None:
        self.settings = settings
        self.store = store
        self._pipeline = pipeline
        self._client = client
        self._changed = asyncio.Condition()
        self._create_lock = asyncio.Lock()
        self._allowed = [_prefix(p) for p in settings.batch_allowed_uris.split(",") if p.strip()]
        self.executor = executor_factory(self)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        jobs = await asyncio.to_thread(self.store.jobs)
        mine = [j for j in jobs if j.executor == self.executor.name and not j.done]
        await self.executor.start(mine)

    async def close(self) -> None:
        await self.executor.close()

    async def save(self, job: Job) -> None:
        await asyncio.to_thread(self.store.save, job)
        async with self._changed:
            self._changed.notify_all()

    # --- create --------------------------------------------------------------------------

    async def create(self, caller: str, p: CreateParams) -> Job:
        if len(p.request_id) > MAX_REQUEST_ID or not p.request_id.isascii():
            raise JobError(
                "INVALID_ARGUMENT",
                f"request_id must be at most {MAX_REQUEST_ID} ASCII characters (a UUID4 is usual)",
            )
        params = self._normalise(p)
        fingerprint = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
        if p.request_id:
            job_id = hashlib.sha256(f"{caller}\0{p.request_id}".encode()).hexdigest()[:24]
            earlier = await asyncio.to_thread(self.store.load, job_id)
            if earlier is not None:
                return self._same(earlier, fingerprint)
        else:
            job_id = new_id()
        async with self._create_lock:
            await self._check_limits(caller)
            job = await self._prepare(job_id, caller, p, params, fingerprint)
            created = await asyncio.to_thread(self.store.create, job)
        if not created:  # another replica made it first with the same request_id
            earlier = await asyncio.to_thread(self.store.load, job_id)
            assert earlier is not None
            return self._same(earlier, fingerprint)
        log.info(
            "batch job created",
            extra={"fields": {"operation": job.name, "caller": caller, **params}},
        )
        try:
            await self.executor.submit(job)
        except Exception as e:
            # Not started: forget the record, so the same request_id can be sent again.
            await asyncio.to_thread(self.store.delete, job.id)
            log.exception("batch job not started", extra={"fields": {"operation": job.name}})
            raise JobError("UNAVAILABLE", f"the batch job could not be started: {e}") from None
        async with self._changed:
            self._changed.notify_all()
        return job

    @staticmethod
    def _same(earlier: Job, fingerprint: str) -> Job:
        if earlier.fingerprint != fingerprint:
            raise JobError(
                "ALREADY_EXISTS",
                f"request_id was used for {earlier.name} with other fields; use a new "
                "request_id for a different job",
            )
        return earlier

    def _normalise(self, p: CreateParams) -> dict[str, Any]:
        if bool(p.input_uri) == bool(p.upload_id):
            raise JobError(
                "INVALID_ARGUMENT",
                "set exactly one of input_uri (a dataset the gateway can read) and upload_id "
                "(images sent with UploadImages)",
            )
        if p.task not in TASK_NAMES:
            raise JobError("INVALID_ARGUMENT", f"task must be detect or classify, got {p.task}")
        if not 0.0 <= p.min_score <= 1.0:
            raise JobError("INVALID_ARGUMENT", f"min_score must be in [0, 1], got {p.min_score}")
        if p.max_detections < 0 or p.top_k < 0:
            raise JobError("INVALID_ARGUMENT", "max_detections and top_k must be >= 0")
        shards = p.shards or 1
        if not 1 <= shards <= MAX_SHARDS:
            raise JobError("INVALID_ARGUMENT", f"shards must be in [1, {MAX_SHARDS}]")
        if p.upload_id and not re.fullmatch(r"[0-9a-f]{1,64}", p.upload_id):
            raise JobError("INVALID_ARGUMENT", "upload_id is not one UploadImages returned")
        return {
            "input_uri": p.input_uri,
            "upload_id": p.upload_id,
            "output_uri": p.output_uri,
            "task": p.task,
            "model": p.model._asdict(),
            "min_score": p.min_score,
            "max_detections": p.max_detections,
            "top_k": p.top_k,
            "shards": shards,
        }

    async def _check_limits(self, caller: str) -> None:
        jobs = await asyncio.to_thread(self.store.jobs)
        live = [j for j in jobs if not j.done]
        limit, per_caller = self.settings.batch_max_jobs, self.settings.batch_max_jobs_per_caller
        if len(live) >= limit:
            raise JobError(
                "RESOURCE_EXHAUSTED",
                f"the gateway has its limit of {limit} unfinished batch jobs; wait for some to "
                "finish or cancel them (GATEWAY_BATCH_MAX_JOBS)",
            )
        mine = sum(j.caller == caller for j in live)
        if mine >= per_caller:
            raise JobError(
                "RESOURCE_EXHAUSTED",
                f"caller {caller} has its limit of {per_caller} unfinished batch jobs; wait for "
                "some to finish or cancel them (GATEWAY_BATCH_MAX_JOBS_PER_CALLER)",
            )

    def _check_output(self, url: str) -> None:
        target = _prefix(url)
        if not any(target.startswith(allowed) for allowed in self._allowed):
            shown = ", ".join(self._allowed) or "(none: only the job store)"
            raise JobError(
                "PERMISSION_DENIED",
                f"output_uri {url} is outside the prefixes this gateway may write to "
                f"({shown}); leave output_uri empty to use the job store, or ask for the prefix "
                "to be added to GATEWAY_BATCH_ALLOWED_URIS",
            )

    async def _check_model(self, task: str, spec: ModelRef) -> ModelRef:
        try:
            model = self._pipeline.model_ref(TASK_NAMES[task], spec)
            config = self._pipeline.registry.get(model.name, TASK_NAMES[task])
            if config.task != TASK_NAMES[task]:
                raise JobError(
                    "FAILED_PRECONDITION",
                    f"model '{model.name}' is configured as a {config.task} model, not for "
                    f"task {task}",
                )
            await self._client.signature(model, self.settings.upstream_timeout)
        except GatewayError as e:
            raise _from_gateway(e) from None
        return model

    async def _prepare(
        self, job_id: str, caller: str, p: CreateParams, params: dict[str, Any], fingerprint: str
    ) -> Job:
        if p.upload_id:
            count, _ = await asyncio.to_thread(self.store.upload_size, p.upload_id)
            if count == 0:
                raise JobError("NOT_FOUND", f"upload {p.upload_id} does not exist or is empty")
            input_url = self.store.upload_url(p.upload_id)
        else:
            input_url = p.input_uri
        if p.output_uri:
            self._check_output(p.output_uri)
            output_url, default_output = p.output_uri, False
        else:
            output_url, default_output = self.store.area_url(job_id), True
        model = await self._check_model(p.task, p.model)
        args = job_args(params, input_url, output_url)
        try:
            dataset, _ = await asyncio.to_thread(_prepare_output, args)
        except sources.DatasetError as e:
            raise JobError("INVALID_ARGUMENT", f"input: {e}") from None
        except storage.StorageError as e:
            raise JobError("INVALID_ARGUMENT", f"output: {e}") from None
        except batch_job.JobError as e:
            raise JobError("FAILED_PRECONDITION", str(e)) from None
        shards = int(params["shards"])
        if shards > len(dataset.files):
            raise JobError(
                "INVALID_ARGUMENT",
                f"shards ({shards}) is more than the input's {len(dataset.files)} files",
            )
        units = [
            [index, unit.name]
            for index in range(shards)
            for unit in sources.units(dataset, index, shards)
        ]
        total = len(dataset.files) if dataset.format == sources.IMAGES else None
        del model
        return Job(
            id=job_id,
            caller=caller,
            request_id=p.request_id,
            fingerprint=fingerprint,
            executor=self.executor.name,
            params=params,
            input_url=input_url,
            output_url=output_url,
            default_output=default_output,
            units=units,
            total=total,
        )

    # --- follow --------------------------------------------------------------------------

    async def get(self, name: str) -> JobView:
        job = await self._load(name)
        return await self.current(job)

    async def current(self, job: Job) -> JobView:
        if not job.done:
            job = await self.executor.refresh(job)
        if job.done and job.final is not None:
            return view(job, None)
        found = await asyncio.to_thread(progress.read, job.output_url, job.units, job.shards)
        return view(job, found)

    async def _load(self, name: str) -> Job:
        job_id = name.removeprefix("operations/")
        job = None
        if name.startswith("operations/"):
            job = await asyncio.to_thread(self.store.load, job_id)
        if job is None:
            raise JobError("NOT_FOUND", f"no operation named {name!r}")
        return job

    async def list(self, filter_text: str, page_size: int, token: str) -> tuple[list[JobView], str]:
        if page_size < 0:
            raise JobError("INVALID_ARGUMENT", "page_size must be >= 0")
        size = min(page_size or DEFAULT_PAGE, MAX_PAGE)
        states = parse_filter(filter_text)
        jobs = await asyncio.to_thread(self.store.jobs)
        after = _decode_token(token, "list") if token else None
        views = []
        for job in jobs:
            if after is not None and (job.create_time, job.id) <= (after["t"], after["id"]):
                continue
            v = await self.current(job)
            if states and v.job.state not in states:
                continue
            views.append(v)
            if len(views) == size:
                break
        next_token = ""
        if len(views) == size:
            last = views[-1].job
            next_token = _encode_token({"k": "list", "t": last.create_time, "id": last.id})
        return views, next_token

    async def wait(self, name: str, timeout: float | None) -> JobView:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = await self.get(name)
            if current.job.done:
                return current
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return current
            # Changes made here wake us at once; other replicas' (and Kubernetes') are polled.
            step = min(remaining, 1.0) if remaining is not None else 1.0
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), step)

    async def cancel(self, name: str) -> None:
        job = await self._load(name)
        if job.done:
            return
        job.cancel_requested = True
        job.state = CANCELLING
        await self.save(job)
        await self.executor.cancel(job)

    async def delete(self, name: str) -> None:
        job = await self._load(name)
        job.cancel_requested = True
        await self.executor.delete(job)  # stops its work, if any
        await asyncio.to_thread(self.store.delete, job.id)
        if job.default_output:
            await asyncio.to_thread(self.store.remove_tree, job.output_url)
        async with self._changed:
            self._changed.notify_all()

    # --- uploads -------------------------------------------------------------------------

    async def upload(self, images: AsyncIterator[tuple[str, str, bytes]]) -> tuple[str, int, int]:
        upload_id = ""
        count = size = 0
        limit = self.settings.batch_max_upload_bytes
        async for given_id, name, data in images:
            if not upload_id:
                if given_id:
                    if not re.fullmatch(r"[0-9a-f]{1,64}", given_id):
                        raise JobError("INVALID_ARGUMENT", "upload_id is not one we returned")
                    count, size = await asyncio.to_thread(self.store.upload_size, given_id)
                    if count == 0:
                        raise JobError("NOT_FOUND", f"upload {given_id} does not exist")
                    upload_id = given_id
                else:
                    upload_id = new_id()
            if not data:
                raise JobError("INVALID_ARGUMENT", f"image {count} of the upload is empty")
            name = name or f"image-{count:08d}"
            if not _UPLOAD_NAME.match(name) or ".." in name:
                raise JobError(
                    "INVALID_ARGUMENT",
                    f"image name {name!r}: use letters, digits, '.', '-', '_' (not first)",
                )
            if size + len(data) > limit:
                raise JobError(
                    "RESOURCE_EXHAUSTED",
                    f"upload {upload_id} would exceed {limit} bytes "
                    "(GATEWAY_BATCH_MAX_UPLOAD_BYTES); "
                    "put larger datasets in storage the gateway can read and pass input_uri",
                )
            await asyncio.to_thread(self.store.put_upload, upload_id, name, data)
            count += 1
            size += len(data)
        if not upload_id:
            raise JobError("INVALID_ARGUMENT", "the upload holds no images")
        return upload_id, count, size

    # --- results -------------------------------------------------------------------------

    async def read(
        self, name: str, token: str
    ) -> AsyncIterator[tuple[str, int, dict[str, Any], str]]:
        job = await self._load(name)
        unit, line = 0, 0
        if token:
            position = _decode_token(token, "read")
            if position.get("id") != job.id:
                raise JobError("INVALID_ARGUMENT", "page_token belongs to another operation")
            unit, line = int(position["u"]), int(position["l"])
        found = await asyncio.to_thread(progress.read, job.output_url, job.units, job.shards)
        for index in range(unit, len(found.files)):
            f = found.files[index]
            start = line if index == unit else 0
            lines = progress.lines(job.output_url, f, start)
            while True:
                got = await asyncio.to_thread(_next_batch, lines, 256)
                if not got:
                    break
                for number, parsed in got:
                    after = _encode_token({"k": "read", "id": job.id, "u": index, "l": number + 1})
                    yield f.name, number, parsed, after
            if not f.finished:
                return  # lines after an unfinished file's committed ones are not in order yet


def _next_batch(lines: Any, count: int) -> list[tuple[int, dict[str, Any]]]:
    batch = []
    for item in lines:
        batch.append(item)
        if len(batch) >= count:
            break
    return batch


def job_args(params: dict[str, Any], input_url: str, output_url: str) -> batch_job.JobArgs:
    model = params["model"]
    return batch_job.JobArgs(
        input=input_url,
        output=output_url,
        task=params["task"],
        model=model["name"],
        version=model["version"],
        label=model["label"],
        min_score=params["min_score"],
        max_detections=params["max_detections"],
        top_k=params["top_k"],
        shard_count=int(params["shards"]),
    )


def _prepare_output(args: batch_job.JobArgs) -> tuple[sources.Dataset, Output]:
    return batch_job.prepare(args, batch_job.RunSettings())


def parse_filter(text: str) -> set[str]:
    """AIP-160 subset: `state = RUNNING`, `metadata.state=QUEUED OR state=RUNNING`,
    `done = true|false`; empty: everything."""
    text = text.strip()
    if not text:
        return set()
    states: set[str] = set()
    for clause in re.split(r"\s+OR\s+", text):
        match = re.fullmatch(r"\s*(metadata\.state|state|done)\s*=\s*\"?(\w+)\"?\s*", clause)
        if not match:
            raise JobError(
                "INVALID_ARGUMENT",
                f"filter {text!r}: use state=<{'|'.join(STATES)}> (joined with OR) or "
                "done=true|false",
            )
        key, value = match.group(1), match.group(2)
        if key == "done":
            if value.lower() not in ("true", "false"):
                raise JobError("INVALID_ARGUMENT", "done must be true or false")
            done = value.lower() == "true"
            states |= set(TERMINAL) if done else {QUEUED, RUNNING, CANCELLING}
        elif value.upper() in STATES:
            states.add(value.upper())
        else:
            raise JobError("INVALID_ARGUMENT", f"unknown state {value!r}; one of {STATES}")
    return states


def _prefix(url: str) -> str:
    try:
        location = storage.resolve(url.strip())
    except storage.StorageError as e:
        raise JobError("INVALID_ARGUMENT", str(e)) from None
    return location.url().rstrip("/") + "/"


def _encode_token(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _decode_token(token: str, kind: str) -> dict[str, Any]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded))
        if not isinstance(data, dict) or data.get("k") != kind:
            raise ValueError(kind)
        return data
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise JobError("INVALID_ARGUMENT", "page_token is not one this API returned") from None


SaveFn = Callable[[Job], Awaitable[None]]
__all__ = [
    "CANCELLED",
    "CANCELLED_CODE",
    "FAILED",
    "RUNNING",
    "SUCCEEDED",
    "CreateParams",
    "Executor",
    "JobError",
    "JobService",
    "JobView",
    "SaveFn",
]
