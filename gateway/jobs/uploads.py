"""Uploads: images callers without storage access hand the gateway for a batch job.

An upload belongs to the caller that made it: adding to it, and creating a job over it,
work only for its owner (and the admins); for anyone else it does not exist. Bounded per
upload (bytes, images), per caller (bytes kept, uploads no job uses yet) and by the whole
store.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

from gateway import errors, identity
from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.jobs.records import new_id
from gateway.jobs.store import JobStore, Upload

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_ID = re.compile(r"[0-9a-f]{1,64}")


def store_full(used: int, limit: int) -> GatewayError:
    return GatewayError(
        Kind.OVERLOADED,
        f"the job store holds {used} of its {limit} bytes (GATEWAY_JOB_STORE_MAX_BYTES); "
        "delete finished operations you no longer need (their results in the store go with "
        "them) or wait for them to expire (GATEWAY_OPERATION_TTL)",
    )


class Room:
    """Bytes an upload call may still add: what the store and the caller's share leave."""

    def __init__(self, store: int, caller: int) -> None:
        self.store = store
        self.caller = caller

    def check(self, caller: str, size: int, s: Settings) -> None:
        if size > self.store:
            raise store_full(s.job_store_max_bytes - self.store, s.job_store_max_bytes)
        if size > self.caller:
            raise GatewayError(
                Kind.OVERLOADED,
                f"caller {identity.shown(caller)} keeps its limit of "
                f"{s.batch_max_upload_bytes_per_caller} bytes of uploads "
                "(GATEWAY_BATCH_MAX_UPLOAD_BYTES_PER_CALLER); delete the operations over "
                "uploads you no longer need, or wait for unused uploads to expire "
                "(GATEWAY_UPLOAD_TTL)",
            )

    def take(self, size: int) -> None:
        self.store -= size
        self.caller -= size


class Uploads:
    def __init__(self, settings: Settings, store: JobStore, admins: frozenset[str]) -> None:
        self._settings = settings
        self._store = store
        self._admins = admins

    def missing(self, upload_id: str) -> GatewayError:
        return GatewayError(Kind.NOT_FOUND, f"upload {upload_id} does not exist or is empty")

    async def find(self, caller: str, upload_id: str) -> Upload:
        """The caller's upload with at least one image; NOT_FOUND otherwise (also when it is
        someone else's)."""
        if not _ID.fullmatch(upload_id):
            raise errors.invalid_input("upload_id is not one UploadImages returned")
        upload = await asyncio.to_thread(self._store.load_upload, upload_id)
        if upload is None or (upload.owner != caller and caller not in self._admins):
            raise self.missing(upload_id)
        count, _ = await asyncio.to_thread(self._store.upload_size, upload_id)
        if count == 0:
            raise self.missing(upload_id)
        return upload

    async def upload(
        self, caller: str, images: AsyncIterator[tuple[str, str, bytes]], in_use: set[str]
    ) -> tuple[str, int, int]:
        """Stores the images (upload id, name, bytes: the id only read from the first);
        `in_use` holds the uploads jobs use. Returns (upload id, images, bytes) of the
        whole upload."""
        s = self._settings
        upload: Upload | None = None
        count = size = 0
        room = Room(0, 0)  # bytes this call may still add
        async for given_id, name, data in images:
            if upload is None:
                upload, count, size, room = await self._open(caller, given_id, in_use)
            if not data:
                raise errors.invalid_input(f"image {count} of the upload is empty")
            name = name or f"image-{count:08d}"
            if not _NAME.fullmatch(name) or ".." in name:
                raise errors.invalid_input(
                    f"image name {name!r}: use letters, digits, '.', '-', '_' (not first)"
                )
            if count >= s.batch_max_upload_images:
                raise GatewayError(
                    Kind.OVERLOADED,
                    f"upload {upload.id} holds its limit of {s.batch_max_upload_images} images "
                    "(GATEWAY_BATCH_MAX_UPLOAD_IMAGES); create a job over it and start another "
                    "upload, or put larger datasets in storage the gateway can read and pass "
                    "input_uri",
                )
            if size + len(data) > s.batch_max_upload_bytes:
                raise GatewayError(
                    Kind.OVERLOADED,
                    f"upload {upload.id} would exceed {s.batch_max_upload_bytes} bytes "
                    "(GATEWAY_BATCH_MAX_UPLOAD_BYTES); put larger datasets in storage the "
                    "gateway can read and pass input_uri",
                )
            room.check(caller, len(data), s)
            await asyncio.to_thread(self._store.put_upload, upload.id, name, data)
            room.take(len(data))
            count += 1
            size += len(data)
        if upload is None:
            raise errors.invalid_input("the upload holds no images")
        await asyncio.to_thread(self._store.touch_upload, upload)
        return upload.id, count, size

    async def _open(
        self, caller: str, given_id: str, in_use: set[str]
    ) -> tuple[Upload, int, int, Room]:
        s = self._settings
        if given_id:
            upload = await self.find(caller, given_id)
            await asyncio.to_thread(self._store.touch_upload, upload)  # kept from expiry
            count, size = await asyncio.to_thread(self._store.upload_size, given_id)
        else:
            mine = await asyncio.to_thread(self._mine, caller)
            open_uploads = sum(u.id not in in_use for u, _ in mine)
            if open_uploads >= s.batch_max_uploads_per_caller:
                raise GatewayError(
                    Kind.OVERLOADED,
                    f"caller {identity.shown(caller)} has {open_uploads} uploads no job uses "
                    "yet, its limit (GATEWAY_BATCH_MAX_UPLOADS_PER_CALLER); create jobs over "
                    "them or add to one (pass its upload_id), or wait for unused ones to expire "
                    "(GATEWAY_UPLOAD_TTL)",
                )
            used = await asyncio.to_thread(self._store.usage)
            if used >= s.job_store_max_bytes:
                raise store_full(used, s.job_store_max_bytes)
            now = int(time.time())
            upload = Upload(new_id(), caller, now, now)
            await asyncio.to_thread(self._store.create_upload, upload)
            count = size = 0
        # Measured once the upload's record is written: what is left is for its images.
        kept = sum(size for _, size in await asyncio.to_thread(self._mine, caller))
        used = await asyncio.to_thread(self._store.usage)
        room = Room(s.job_store_max_bytes - used, s.batch_max_upload_bytes_per_caller - kept)
        return upload, count, size, room

    def _mine(self, caller: str) -> list[tuple[Upload, int]]:
        return [
            (u, self._store.upload_size(u.id)[1])
            for u in self._store.uploads()
            if u.owner == caller
        ]
