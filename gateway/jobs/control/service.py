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
from typing import Any

from google.protobuf.message import Message

from gateway import errors, identity
from gateway.errors import GatewayError, Kind
from gateway.jobs.control import results
from gateway.jobs.control.admission import Admission, split
from gateway.jobs.control.counts import view
from gateway.jobs.control.executor import Executor, ExecutorError
from gateway.jobs.control.index import admit
from gateway.jobs.control.leases import Leases, replica_id
from gateway.jobs.control.paging import decode_token, encode_token, parse_filter
from gateway.jobs.control.uploads import Uploads
from gateway.jobs.runner import progress as status
from gateway.jobs.spec.records import CANCELLING, Job, new_id
from gateway.jobs.spec.views import CreateJob, JobView

log = logging.getLogger("gateway.jobs")

DEFAULT_PAGE = 50
MAX_PAGE = 1000
POLL_SECONDS = 1.0  # how often a wait looks at changes other processes made
# The longest a WaitOperation holds a call, on every door, whatever the timeout asked for (none
# included): load balancers commonly close connections idle for 60 s. The answer is then the
# operation not done yet: wait again.
MAX_WAIT_SECONDS = 60.0
# Expiry: finished operations older than GATEWAY_OPERATION_TTL go with the results kept in the
# store, uploads no job uses GATEWAY_UPLOAD_TTL after their last upload call; one replica at a
# time sweeps, the one holding this lease. Between sweeps a quarter of the shorter TTL, within
# these bounds (seconds).
EXPIRY_LEASE = "expiry"
MIN_SWEEP_INTERVAL, MAX_SWEEP_INTERVAL = 0.5, 60.0


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
        identity.runner_identities(self.settings.batch_runner_identities)  # typed, or no start
        self.leases = Leases(self.store, replica_id(), self.settings.job_lease_seconds)
        self.uploads = Uploads(self.settings, self.store, self.admins)
        self._changed = asyncio.Condition()
        self._create_lock = asyncio.Lock()
        self._expiry: asyncio.Task[None] | None = None
        self.executor = executor_factory(self)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        jobs = await asyncio.to_thread(self.store.jobs)
        # Stores written before the callers' indexes and the tally existed get them.
        await asyncio.to_thread(self.store.upgrade, jobs)
        mine = [j for j in jobs if j.executor == self.executor.name and not j.done]
        # Stores written before the index of unfinished jobs existed get it.
        await asyncio.to_thread(self.store.mark_active, [j.id for j in mine])
        await self.executor.start(mine)
        self._expiry = asyncio.create_task(self._expire_while_leased())

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        await self.executor.close()

    async def save(self, job: Job) -> Job | None:
        """Merges an executor's change into the record (gateway.jobs.control.store.merge: a job that
        ended stays ended, a cancel is never lost); the record as written, None when the
        job is gone."""
        saved = await asyncio.to_thread(self.store.save, job)
        await self.changed()
        return saved

    async def changed(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def visible(self, job: Job, caller: str) -> bool:
        return job.caller == caller or caller in self.admins

    # --- create --------------------------------------------------------------------------

    async def create(self, caller: str, request: CreateJob) -> Job:
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
            await self.uploads.use(upload)
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
            legacy_api=request.legacy_api,
        )
        async with self._create_lock:
            await checks.check_live()
            await checks.check_model(spec, binding)
            await checks.prepare(job)
            await asyncio.to_thread(self.store.entries, caller)  # corrected from the records
            limits = (self.settings.batch_max_jobs_per_caller,
                      self.settings.batch_max_finished_per_caller)  # fmt: skip
            await asyncio.to_thread(self.store.index.change, caller, admit(job, *limits))
            try:
                created = await asyncio.to_thread(
                    self.store.create, job, self.settings.batch_max_jobs
                )
            except GatewayError:  # the store is full
                await asyncio.to_thread(self.store.index.drop, caller, job.id)
                raise
        if not created:  # another replica made it first with the same request_id
            earlier = await asyncio.to_thread(self.store.load, job_id)
            if earlier is None:
                raise GatewayError(
                    Kind.ABORTED, f"{job.name} is being deleted; send the request again"
                )
            return self._same(earlier, fingerprint)
        log.info(
            "batch job created",
            extra={"fields": {"operation": job.name, "caller": caller, **spec.to_json()}},
        )
        try:
            await self.executor.submit(job)
        except Exception as e:
            # Not started: forget the record, so the same request_id can be sent again.
            await asyncio.to_thread(self.store.forget, job)
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
        """The caller's operations (everyone's for an admin), oldest first: read from the
        callers' indexes, so only the records shown (and unfinished ones) are read."""
        if page_size < 0:
            raise errors.invalid_input("page_size must be >= 0")
        size = min(page_size or DEFAULT_PAGE, MAX_PAGE)
        states = parse_filter(filter_text)
        after = None
        if token:
            position = decode_token(token, "list", t=float, id=str)
            after = (float(position["t"]), str(position["id"]))
        owners = [caller]
        if caller in self.admins:
            owners = await asyncio.to_thread(self.store.index.callers)
        entries = []
        for owner in owners:
            found = await asyncio.to_thread(self.store.entries, owner)
            entries += [(float(t), job_id, state) for job_id, (t, state) in found.items()]
        entries.sort()
        views = []
        for created, job_id, state in entries:
            if after is not None and (created, job_id) <= after:
                continue
            if state and states and state not in states:
                continue  # a final state never changes: no need to read the record
            job = await asyncio.to_thread(self.store.load, job_id)
            if job is None or not self.visible(job, caller):
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
        """The operation once done, or as it is after `timeout` seconds (at most, and with
        no timeout, MAX_WAIT_SECONDS)."""
        limit = MAX_WAIT_SECONDS if timeout is None else min(timeout, MAX_WAIT_SECONDS)
        deadline = time.monotonic() + max(0.0, limit)
        while True:
            current = await self.get(caller, name)
            if current.job.done:
                return current
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return current
            # Changes made here wake us at once; other processes' (and Kubernetes') are polled.
            step = min(remaining, POLL_SECONDS)
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), step)

    async def cancel(self, caller: str, name: str) -> None:
        job = await self.load(caller, name)

        def ask(current: Job) -> bool:
            if current.done or current.cancel_requested:
                return False  # ended (too late to cancel), or asked already
            current.cancel_requested = True
            current.state = CANCELLING
            return True

        changed = await asyncio.to_thread(self.store.update, job.id, ask)
        await self.changed()
        if changed is not None and not changed.done:
            await self.executor.cancel(changed)

    async def delete(self, caller: str, name: str) -> None:
        await self.remove(await self.load(caller, name))

    async def remove(self, job: Job) -> None:
        """Stops the job's work, if any, and forgets it with the results kept in the store.
        The record becomes a tombstone first (the job is gone for callers at once); whoever
        holds the job's lease removes its files and then the record: this process when it
        can take the lease, else the holder as it stops, or the expiry sweep once the
        holder's lease expired. So no file is written after its removal."""

        def mark(current: Job) -> bool:
            current.deleted = True
            current.cancel_requested = True
            return True

        job.cancel_requested = True
        await asyncio.to_thread(self.store.update, job.id, mark)
        await self.executor.delete(job)
        await self.finish_delete(job)
        await self.changed()

    async def finish_delete(self, job: Job) -> bool:
        """Removes a deleted job's files and record if no other process holds its lease;
        False when one does (it finishes the delete itself)."""
        lease = await asyncio.to_thread(self.leases.acquire, job.id)
        if lease is None:
            return False
        if job.default_output:
            await asyncio.to_thread(self.store.remove_area, job.id)
        forgotten = await asyncio.to_thread(self.store.forget, job)
        await asyncio.to_thread(self.leases.remove, job.id, lease)
        if forgotten:  # logged once nothing of the job is left, its lease included
            log.info("batch job deleted", extra={"fields": {"operation": job.name}})
        return True

    # --- uploads and results -------------------------------------------------------------

    async def upload(
        self, caller: str, images: AsyncIterator[tuple[str, str, bytes]]
    ) -> tuple[str, int, int]:
        return await self.uploads.upload(caller, images)

    async def read(
        self, caller: str, name: str, token: str
    ) -> AsyncIterator[tuple[type[Message], str, int, dict[str, Any], str]]:
        """(the job's result message type, result file, line index, line, token after it) in
        input order."""
        job = await self.load(caller, name)
        result_type = job.spec.binding(self.bindings).result_type
        async for file, index, line, after in results.read(job, token):
            yield result_type, file, index, line, after

    # --- expiry ----------------------------------------------------------------------------

    async def expire(self) -> tuple[int, int]:
        """One sweep; (operations, uploads) removed. Also finishes the deletes whose holder
        stopped before it could (a tombstone and no live lease)."""
        now = time.time()
        operations = 0
        for job in await asyncio.to_thread(self.store.jobs, True):
            ended = job.end_time if job.end_time is not None else job.update_time
            if job.deleted:  # stopped here first, if it runs here
                await self.executor.delete(job)
                await self.finish_delete(job)
            elif job.done and now - ended > self.settings.operation_ttl:
                await self.remove(job)
                operations += 1
                log.info("operation expired", extra={"fields": {"operation": job.name}})
        kept = await asyncio.to_thread(self.store.jobs, True)
        in_use = {j.upload_id for j in kept if j.upload_id and not j.deleted}
        known = {j.id for j in kept}
        for name in await asyncio.to_thread(self.leases.names):
            if name == EXPIRY_LEASE or name in known:
                continue
            lease = await asyncio.to_thread(self.leases.current, name)
            if lease is None or not lease.live():  # a deleted job's, left by its last holder
                await asyncio.to_thread(self.leases.remove, name, lease)
        uploads = 0
        for upload in await asyncio.to_thread(self.store.uploads):
            if upload.id not in in_use and now - upload.update_time > self.settings.upload_ttl:
                await asyncio.to_thread(self.store.delete_upload, upload)
                uploads += 1
                log.info("upload expired", extra={"fields": {"upload_id": upload.id}})
        return operations, uploads

    async def _expire_while_leased(self) -> None:
        """Sweeps while this process holds the expiry lease, until cancelled; a failed sweep
        is logged and retried at the next."""
        ttl = min(self.settings.upload_ttl, self.settings.operation_ttl)
        every = min(MAX_SWEEP_INTERVAL, max(MIN_SWEEP_INTERVAL, ttl / 4))
        while True:
            try:
                if await asyncio.to_thread(self.leases.acquire, EXPIRY_LEASE) is not None:
                    await self.expire()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("expiry sweep failed; retried")
            await asyncio.sleep(every)
