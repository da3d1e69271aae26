"""Outputs belong to the caller whose job first wrote there.

A job whose caller names its `output_uri` claims the area before anything else is written:
`OUTPUT/_batch/owner.json` (the caller's typed identity), created only if absent (a hard link
on a local disk, a conditional PUT where the filesystem has one), so of two callers racing
for a new area one wins. A later job of the same caller resumes there; anyone else's is
refused with the words an output outside the allowed prefixes gets, so the refusal repeats
nothing of the owner's job. An area holding a job but no owner (written by
`detection-batch` by hand, or before owners were recorded) belongs to nobody who calls the
API: it is refused too.
"""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from gateway.jobs.runner import storage
from gateway.jobs.runner.output import STATE

OWNER_FILE = posixpath.join(STATE, "owner.json")
JOB_FILE = posixpath.join(STATE, "job.json")


def claim(url: str, caller: str) -> bool:
    """True when the output area `url` is `caller`'s (claimed now, or by its earlier job);
    False when it is someone else's (blocking I/O)."""
    location = storage.resolve(url)
    fs, root = location.fs, location.path
    owner = posixpath.join(root, OWNER_FILE)
    if not _exists(fs, owner):
        if _exists(fs, posixpath.join(root, JOB_FILE)):
            return False  # a job without an owner: not one this caller can prove is theirs
        if _create(fs, owner, json.dumps({"caller": caller}).encode()):
            return True
    try:
        found = json.loads(fs.cat_file(owner))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("caller") == caller


def _exists(fs: Any, path: str) -> bool:
    fs.invalidate_cache()
    return bool(fs.exists(path))


def _create(fs: Any, path: str, data: bytes) -> bool:
    """Writes a new file; False when it exists already (of two writers, one wins)."""
    if isinstance(fs, LocalFileSystem):
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-owner")
        with open(temporary, "wb") as f:
            f.write(data)
        try:
            os.link(temporary, path)  # atomic, fails when the file exists
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)
        return True
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    return True
