"""Expiry: finished operations older than GATEWAY_OPERATION_TTL go with the results kept in
the store, and uploads no job uses go GATEWAY_UPLOAD_TTL after their last upload call. One
replica at a time sweeps: the one holding the `expiry` lease (gateway.jobs.leases)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.jobs.service import JobService

log = logging.getLogger("gateway.jobs")

# Between sweeps: a quarter of the shorter TTL, within these bounds (seconds).
MIN_INTERVAL, MAX_INTERVAL = 0.5, 60.0
LEASE = "expiry"


def interval(upload_ttl: float, operation_ttl: float) -> float:
    return min(MAX_INTERVAL, max(MIN_INTERVAL, min(upload_ttl, operation_ttl) / 4))


async def sweep(service: JobService) -> tuple[int, int]:
    """One pass; returns (operations, uploads) removed. Also finishes the deletes whose
    holder stopped before it could (a tombstone and no live lease)."""
    settings, store = service.settings, service.store
    now = time.time()
    jobs = await asyncio.to_thread(store.jobs, True)
    operations = 0
    for job in jobs:
        ended = job.end_time if job.end_time is not None else job.update_time
        if job.deleted:  # stopped here first, if it runs here
            await service.executor.delete(job)
            await service.finish_delete(job)
        elif job.done and now - ended > settings.operation_ttl:
            await service.remove(job)
            operations += 1
            log.info("operation expired", extra={"fields": {"operation": job.name}})
    kept = await asyncio.to_thread(store.jobs, True)
    in_use = {j.upload_id for j in kept if j.upload_id and not j.deleted}
    known = {j.id for j in kept}
    for name in await asyncio.to_thread(service.leases.names):
        if name == LEASE or name in known:
            continue
        lease = await asyncio.to_thread(service.leases.current, name)
        if lease is None or not lease.live():  # a deleted job's, left by its last holder
            await asyncio.to_thread(service.leases.remove, name, lease)
    uploads = 0
    for upload in await asyncio.to_thread(store.uploads):
        if upload.id not in in_use and now - upload.update_time > settings.upload_ttl:
            await asyncio.to_thread(store.delete_upload, upload)
            uploads += 1
            log.info("upload expired", extra={"fields": {"upload_id": upload.id}})
    return operations, uploads


async def run(service: JobService) -> None:
    """Sweeps, while this process holds the expiry lease, until cancelled; a failed pass is
    logged and retried at the next."""
    every = interval(service.settings.upload_ttl, service.settings.operation_ttl)
    leases = service.leases
    while True:
        try:
            if await asyncio.to_thread(leases.acquire, LEASE) is not None:
                await sweep(service)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("expiry sweep failed; retried")
        await asyncio.sleep(every)
