"""Uploads: images callers without storage access hand the gateway for a batch job.

An upload belongs to the caller that made it: adding to it, and creating a job over it,
work only for its owner (and the admins); for anyone else it does not exist. Bounded per
upload (bytes, images), per caller (bytes kept, uploads no job uses yet) and by the whole
store. Each bound is a reservation taken before the bytes are written, in the store's tally
(gateway.jobs.control.tally) and the upload's record, both by conditional write: concurrent calls,
through one replica or several, cannot pass a limit together.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

from gateway import errors
from gateway.config import Settings
from gateway.errors import GatewayError, Kind
from gateway.jobs.control.store import JobStore, Upload
from gateway.jobs.control.tally import RECORD_BYTES
from gateway.jobs.spec.records import new_id

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_ID = re.compile(r"[0-9a-f]{1,64}")


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
        if upload.images == 0:
            raise self.missing(upload_id)
        return upload

    async def upload(
        self, caller: str, images: AsyncIterator[tuple[str, str, bytes]]
    ) -> tuple[str, int, int]:
        """Stores the images (upload id, name, bytes: the id only read from the first).
        Returns (upload id, images, bytes) of the whole upload."""
        upload: Upload | None = None
        async for given_id, name, data in images:
            if upload is None:
                upload = await self._open(caller, given_id)
            if not data:
                raise errors.invalid_input(f"image {upload.images} of the upload is empty")
            name = name or f"image-{upload.images:08d}"
            if not _NAME.fullmatch(name) or ".." in name:
                raise errors.invalid_input(
                    f"image name {name!r}: use letters, digits, '.', '-', '_' (not first)"
                )
            upload = await asyncio.to_thread(self._add, upload.owner, upload.id, name, data)
        if upload is None:
            raise errors.invalid_input("the upload holds no images")
        return upload.id, upload.images, upload.bytes

    def _add(self, caller: str, upload_id: str, name: str, data: bytes) -> Upload:
        """Reserves the image's bytes (in the store and of the upload's owner `caller`),
        counts it in the upload's record (images, bytes), then writes it; a refusal leaves
        nothing reserved."""
        s = self._settings
        store = self._store
        size = len(data)
        store.tally.reserve(size, caller, s.batch_max_upload_bytes_per_caller)

        def count(upload: Upload) -> bool:
            if upload.images >= s.batch_max_upload_images:
                raise GatewayError(
                    Kind.OVERLOADED,
                    f"upload {upload.id} holds its limit of {s.batch_max_upload_images} images "
                    "(GATEWAY_BATCH_MAX_UPLOAD_IMAGES); create a job over it and start another "
                    "upload, or put larger datasets in storage the gateway can read and pass "
                    "input_uri",
                )
            if upload.bytes + size > s.batch_max_upload_bytes:
                raise GatewayError(
                    Kind.OVERLOADED,
                    f"upload {upload.id} would exceed {s.batch_max_upload_bytes} bytes "
                    "(GATEWAY_BATCH_MAX_UPLOAD_BYTES); put larger datasets in storage the "
                    "gateway can read and pass input_uri",
                )
            upload.images += 1
            upload.bytes += size
            return True

        try:
            upload = store.update_upload(upload_id, count)
        except BaseException:
            store.tally.release(size, caller)
            raise
        if upload is None:  # expired meanwhile
            store.tally.release(size, caller)
            raise self.missing(upload_id)
        store.put_upload(upload_id, name, data)
        return upload

    async def _open(self, caller: str, given_id: str) -> Upload:
        if given_id:
            upload = await self.find(caller, given_id)
            return upload
        s = self._settings
        await asyncio.to_thread(
            self._store.tally.open_upload, caller, s.batch_max_uploads_per_caller
        )
        now = int(time.time())
        upload = Upload(new_id(), caller, now, now)
        try:
            await asyncio.to_thread(self._store.create_upload, upload)
        except BaseException:
            await asyncio.to_thread(self._store.tally.release, 0, caller, 1, RECORD_BYTES)
            raise
        return upload

    async def use(self, upload: Upload) -> None:
        """A job uses the upload: it no longer counts as open (given back to its owner's
        count once, by the write that marked it), and it is kept from expiry."""
        first = False

        def mark(current: Upload) -> bool:
            nonlocal first
            first = not current.used
            current.used = True
            return True  # rewritten either way: update_time keeps it from expiry

        found = await asyncio.to_thread(self._store.update_upload, upload.id, mark)
        if found is None:
            raise self.missing(upload.id)
        if first:
            await asyncio.to_thread(self._store.tally.release, 0, upload.owner, 1)
