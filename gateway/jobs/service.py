"""Batch jobs, transport-neutral: create, follow, cancel, delete, upload images, read results.
The doors only convert; failures are GatewayError (gateway.errors.Kind), mapped by each
door's status table.

Operations belong to their caller (gateway.identity): for anyone else, an operation or an
upload does not exist (NOT_FOUND, the same message as for a name never created), and
listings show only the caller's own. The admins (GATEWAY_BATCH_ADMINS) see and manage all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from gateway import errors, identity
from gateway.batch import status
from gateway.errors import GatewayError, Kind
from gateway.jobs import expiry, results
from gateway.jobs.admission import Admission, Request, split
from gateway.jobs.leases import Leases, replica_id
from gateway.jobs.paging import decode_token, encode_token, parse_filter
from gateway.jobs.records import CANCELLING, Job, new_id
from gateway.jobs.uploads import Uploads
from gateway.jobs.views import JobView, view

log = logging.getLogger("gateway.jobs")

DEFAULT_PAGE = 50
MAX_PAGE = 1000
POLL_SECONDS = 1.0  # how often a wait looks at changes other processes made


class Executor(Protocol):
    name: str

    async def start(self, jobs: list[Job]) -> None: ...

    async def submit(self, job: Job) -> None: ...

    async def cancel(self, job: Job) -> None: ...

    async def delete(self, job: Job) -> None: ...

    async def refresh(self, job: Job) -> Job: ...

    async def close(self) -> None: ...


class ExecutorError(Exception):
    """The executor could not start a job; the message says why (and what to change)."""


def no_operation(name: str) -> GatewayError:
    return GatewayError(Kind.NOT_FOUND, f"no operation named {name!r}")


class JobService:
    def __init__(
        self,
        admission: Admission,
        executor_factory: Callable[[JobService], Executor],
    ) -> None:
        # What creation checks holds the settings, the store and the bindings the job
        # service shares (built by the composition root: it alone reaches the pipeline).
        self.admission = admission
        self.settings = admission.settings
        self.store = admission.store
        self.bindings = admission.bindings
        self.admins = identity.parse_admins(split(self.settings.batch_admins))  # typed
        self.leases = Leases(self.store, replica_id(), self.settings.job_lease_seconds)
        self.uploads = Uploads(self.settings, self.store, self.admins)
        self._changed = asyncio.Condition()
        self._create_lock = asyncio.Lock()
        self._expiry: asyncio.Task[None] | None = None
        self.executor = executor_factory(self)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        jobs = await asyncio.to_thread(self.store.jobs)
        mine = [j for j in jobs if j.executor == self.executor.name and not j.done]
        # Stores written before the index of unfinished jobs existed get it.
        await asyncio.to_thread(self.store.mark_active, [j.id for j in mine])
        await self.executor.start(mine)
        self._expiry = asyncio.create_task(expiry.run(self))

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        await self.executor.close()

    async def save(self, job: Job) -> None:
        await asyncio.to_thread(self.store.save, job)
        await self.changed()

    async def changed(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def visible(self, job: Job, caller: str) -> bool:
        return job.caller == caller or caller in self.admins

    # --- create --------------------------------------------------------------------------

    async def create(self, caller: str, request: Request) -> Job:
        checks = self.admission
        binding = checks.check_fields(request)
        spec = request.spec
        shape = {"spec": spec.to_json(), "upload_id": request.upload_id}
        fingerprint = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
        if request.request_id:
            key = f"{caller}\0{request.request_id}".encode()
            job_id = hashlib.sha256(key).hexdigest()[:24]
            earlier = await asyncio.to_thread(self.store.load, job_id)
            if earlier is not None:
                return self._same(earlier, fingerprint)
        else:
            job_id = new_id()
        if request.upload_id:
            upload = await self.uploads.find(caller, request.upload_id)
            await asyncio.to_thread(self.store.touch_upload, upload)  # kept from expiry
            spec = spec.replace(input=self.store.upload_url(request.upload_id))
        else:
            checks.check_input(spec.input)
        default_output = not spec.output
        if default_output:
            spec = spec.replace(output=self.store.area_url(job_id))
        else:
            checks.check_output(spec.output)
        job = Job(
            id=job_id,
            caller=caller,
            spec=spec,
            executor=self.executor.name,
            units=[],
            total=None,
            request_id=request.request_id,
            fingerprint=fingerprint,
            upload_id=request.upload_id,
            default_output=default_output,
        )
        async with self._create_lock:
            await checks.check_limits(caller, await asyncio.to_thread(self.store.jobs))
            await checks.check_model(spec, binding)
            await checks.prepare(job)
            created = await asyncio.to_thread(self.store.create, job)
        if not created:  # another replica made it first with the same request_id
            earlier = await asyncio.to_thread(self.store.load, job_id)
            assert earlier is not None
            return self._same(earlier, fingerprint)
        log.info(
            "batch job created",
            extra={"fields": {"operation": job.name, "caller": caller, **spec.to_json()}},
        )
        try:
            await self.executor.submit(job)
        except Exception as e:
            # Not started: forget the record, so the same request_id can be sent again.
            await asyncio.to_thread(self.store.delete, job.id)
            fields = {"operation": job.name, "error": str(e)}
            if isinstance(e, ExecutorError):  # a refusal the message explains
                log.error("batch job not started", extra={"fields": fields})
            else:
                log.exception("batch job not started", extra={"fields": fields})
            raise GatewayError(
                Kind.UNAVAILABLE, f"the batch job could not be started: {e}"
            ) from None
        await self.changed()
        return job

    @staticmethod
    def _same(earlier: Job, fingerprint: str) -> Job:
        if earlier.fingerprint != fingerprint:
            raise GatewayError(
                Kind.ALREADY_EXISTS,
                f"request_id was used for {earlier.name} with other fields; use a new "
                "request_id for a different job",
            )
        return earlier

    # --- follow --------------------------------------------------------------------------

    async def load(self, caller: str, name: str) -> Job:
        """The caller's operation `name`; NOT_FOUND when there is none, or it is not theirs."""
        job = None
        if name.startswith("operations/"):
            job = await asyncio.to_thread(self.store.load, name.removeprefix("operations/"))
        if job is None or not self.visible(job, caller):
            raise no_operation(name)
        return job

    async def get(self, caller: str, name: str) -> JobView:
        return await self.current(await self.load(caller, name))

    async def current(self, job: Job) -> JobView:
        if not job.done:
            job = await self.executor.refresh(job)
        if job.done and job.final is not None:
            return view(job, None)
        found = await asyncio.to_thread(status.read, job.spec.output, job.units, job.shards)
        return view(job, found)

    async def list(
        self, caller: str, filter_text: str, page_size: int, token: str
    ) -> tuple[list[JobView], str]:
        if page_size < 0:
            raise errors.invalid_input("page_size must be >= 0")
        size = min(page_size or DEFAULT_PAGE, MAX_PAGE)
        states = parse_filter(filter_text)
        jobs = await asyncio.to_thread(self.store.jobs)
        after = decode_token(token, "list") if token else None
        views = []
        for job in jobs:
            if not self.visible(job, caller):
                continue
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
            next_token = encode_token({"k": "list", "t": last.create_time, "id": last.id})
        return views, next_token

    async def wait(self, caller: str, name: str, timeout: float | None) -> JobView:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = await self.get(caller, name)
            if current.job.done:
                return current
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return current
            # Changes made here wake us at once; other processes' (and Kubernetes') are polled.
            step = min(remaining, POLL_SECONDS) if remaining is not None else POLL_SECONDS
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), step)

    async def cancel(self, caller: str, name: str) -> None:
        job = await self.load(caller, name)
        if job.done:
            return
        job.cancel_requested = True
        job.state = CANCELLING
        await self.save(job)
        await self.executor.cancel(job)

    async def delete(self, caller: str, name: str) -> None:
        await self.remove(await self.load(caller, name))

    async def remove(self, job: Job) -> None:
        """Stops the job's work, if any, and forgets it with the results kept in the store."""
        job.cancel_requested = True
        await self.executor.delete(job)
        await asyncio.to_thread(self.store.delete, job.id)
        if job.default_output:
            await asyncio.to_thread(self.store.remove_tree, job.spec.output)
        await self.changed()

    # --- uploads and results -------------------------------------------------------------

    async def upload(
        self, caller: str, images: AsyncIterator[tuple[str, str, bytes]]
    ) -> tuple[str, int, int]:
        jobs = await asyncio.to_thread(self.store.jobs)
        in_use = {j.upload_id for j in jobs if j.upload_id}
        return await self.uploads.upload(caller, images, in_use)

    async def read(
        self, caller: str, name: str, token: str
    ) -> AsyncIterator[tuple[Job, str, int, dict[str, Any], str]]:
        """(job, result file, line index, line, token after it) in input order."""
        job = await self.load(caller, name)
        async for file, index, line, after in results.read(job, token):
            yield job, file, index, line, after
