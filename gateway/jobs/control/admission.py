"""Everything CreateBatchJob checks before a job exists, so what can fail at once does, with
a clear status: the fields, where the job may read and write, the limits, the model, and the
input itself (listed, and OUTPUT's job.json written)."""

from __future__ import annotations

import asyncio

from gateway import errors
from gateway.api import strings
from gateway.api.bindings import Binding, Bindings
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.errors import GatewayError, Kind
from gateway.jobs.control import owners
from gateway.jobs.control.store import JobStore
from gateway.jobs.control.tally import jobs_full, store_full
from gateway.jobs.runner import job as batch_job
from gateway.jobs.runner import sources, storage
from gateway.jobs.runner.access import Guard, check_prefixes, place
from gateway.jobs.runner.dataset_limits import LimitExceeded, Limits
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.records import Job
from gateway.jobs.spec.views import CreateJob


def split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def input_guard(settings: Settings, job: Job | None = None) -> Guard:
    """Where a job may read: the allowed prefixes and its own upload, never the rest of the
    job store (nor anything holding it)."""
    guard = Guard.of(split(settings.batch_allowed_input_uris), fences=[settings.job_store])
    if job is not None and job.upload_id:
        guard = guard.with_places([place(job.spec.input)])
    return guard


def job_limits(settings: Settings, job: Job) -> Limits:
    """What the job may read; over an upload, no more lines or records than the images an
    upload may hold (a manifest must not buy what uploaded files may not)."""
    items, setting = settings.batch_max_items_per_job, "GATEWAY_BATCH_MAX_ITEMS_PER_JOB"
    if job.upload_id and settings.batch_max_upload_images < items:
        items, setting = settings.batch_max_upload_images, "GATEWAY_BATCH_MAX_UPLOAD_IMAGES"
    return Limits(
        max_image_bytes=settings.max_image_bytes,
        max_items=items,
        max_input_files=settings.batch_max_input_files,
        max_decompressed_bytes=settings.batch_max_decompressed_bytes,
        items_setting=setting,
    )


def output_refusal(url: str, guard: Guard) -> GatewayError:
    """One answer for an output outside the prefixes and for another caller's output."""
    shown = ", ".join(guard.urls()) or "none: only the job store"
    return GatewayError(
        Kind.PERMISSION_DENIED,
        f"output_uri {url} is not a place this caller may write to: outputs go below the "
        f"prefixes this gateway may write to ({shown}), outside the job store and not into "
        "another caller's output; leave output_uri empty to use the job store, or ask for "
        "the prefix to be added to GATEWAY_BATCH_ALLOWED_URIS",
    )


class Admission:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        cascades: Cascades,
        bindings: Bindings,
    ) -> None:
        self.settings = settings
        self.store = store  # the jobs' store, shared with the service
        self.bindings = bindings
        self._cascades = cascades
        # Startup refuses prefixes that are no place or overlap the job store.
        check_prefixes(
            "GATEWAY_BATCH_ALLOWED_INPUT_URIS",
            split(settings.batch_allowed_input_uris),
            settings.job_store,
        )
        outputs = check_prefixes(
            "GATEWAY_BATCH_ALLOWED_URIS", split(settings.batch_allowed_uris), settings.job_store
        )
        self._outputs = Guard(outputs, fences=[p for p in [place(settings.job_store)] if p])

    def check_fields(self, request: CreateJob) -> Binding:
        """What needs no I/O (GatewayError INVALID_INPUT); the task's binding."""
        strings.request_id(request.request_id)  # the doors' rule for caller strings
        if bool(request.spec.input) == bool(request.upload_id):
            raise errors.invalid_input(
                "set exactly one of input_uri (a dataset the gateway can read) and upload_id "
                "(images sent with UploadImages)"
            )
        spec = request.spec
        texts = {
            "input_uri": spec.input,
            "output_uri": spec.output,
            "upload_id": request.upload_id,
            "request_id": request.request_id,
            "model.name": spec.model.name,
            "model.label": spec.model.label or "",
        }
        for name, text in texts.items():
            bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)
            if bad is not None:
                raise errors.invalid_input(
                    f"{name} holds the control character {bad!r}: names and URIs are printable text"
                )
        # The doors' rule for a model's (or pipeline's) name and label: errors quote them.
        name_field = "pipeline" if spec.pipeline else "model.name"
        strings.check(name_field, spec.model.name, strings.MAX_MODEL_NAME)
        strings.check("model.label", spec.model.label or "", strings.MAX_MODEL_NAME)
        binding = request.spec.binding(self.bindings)
        request.spec.check()
        return binding

    def check_input(self, url: str) -> None:
        """An input_uri a caller named: inside an allowed prefix and not in the job store
        (uploads are named by upload_id); the same refusal whether it exists or not."""
        input_guard(self.settings).check_place(url, "input_uri")

    def check_output(self, url: str) -> None:
        """An output_uri a caller named, before any I/O: below an allowed prefix, outside the
        job store (its ownership is claimed by `prepare`)."""
        if not self._outputs.allows(place(url)):
            raise output_refusal(url, self._outputs)

    async def check_live(self) -> None:
        """Room for one more unfinished job, and in the store, as the tally says now: an
        early refusal before the input is listed (the slot itself is taken with the record,
        gateway.jobs.control.store.create; the caller's own limits in its index)."""
        limit = self.settings.batch_max_jobs
        tally = await asyncio.to_thread(self.store.tally.read)
        if int(tally.get("jobs", 0)) >= limit:
            raise jobs_full(limit)
        used = int(tally["bytes"])
        if used >= self.store.tally.limit:
            raise store_full(used, self.store.tally.limit)

    async def check_model(self, spec: JobSpec, binding: Binding) -> None:
        """What every image would otherwise fail on, as the pipeline judges it (Cascades.check:
        the model exists and is configured for the task, the options are valid for it, its
        outputs are ones the task can read; for a pipeline job, the pipeline exists and its
        first and required models pass the same); the names and types of the options first."""
        binding.check_options(spec.options)  # names and types; the task judges the values
        message = spec.request(binding)
        request = binding.to_request(message, "", "", None, ())
        await self._cascades.check(spec.task, request)

    async def prepare(self, job: Job) -> Job:
        """Claims a named output for the caller, lists the input and writes OUTPUT's
        job.json; the job's result files and, for a directory of images, its total."""
        named = job.spec.output
        if not job.default_output and not await asyncio.to_thread(owners.claim, named, job.caller):
            raise output_refusal(named, self._outputs)
        try:
            dataset, _ = await asyncio.to_thread(
                batch_job.prepare,
                job.spec,
                input_guard(self.settings, job),
                job_limits(self.settings, job),
            )
        except LimitExceeded as e:
            raise e.error() from None
        except sources.DatasetError as e:
            raise errors.invalid_input(f"input: {e}") from None
        except storage.StorageError as e:
            raise errors.invalid_input(f"output: {e}") from None
        except batch_job.JobError as e:
            raise GatewayError(Kind.PRECONDITION, str(e)) from None
        shards = job.spec.shards
        if shards > len(dataset.files):
            raise errors.invalid_input(
                f"shards ({shards}) is more than the input's {len(dataset.files)} files"
            )
        job.units = [
            (index, unit.name)
            for index in range(shards)
            for unit in sources.units(dataset, index, shards)
        ]
        job.total = len(dataset.files) if dataset.format == sources.IMAGES else None
        return job
