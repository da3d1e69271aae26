"""Conditional writes in the job store (gateway.jobs.control.cas), on a local disk under racing
threads and processes, and on S3 (moto's server on loopback, through s3fs): a replace over a
version that changed, or a file that is gone, fails; an old version never comes back."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.jobs.control.cas import Files
from gateway.jobs.runner import storage
from tests.support.localserver import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "foo", "AWS_SECRET_ACCESS_KEY": "foo",
               "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in CREDENTIALS.items():
            patch.setenv(key, value)
        patch.delenv("AWS_PROFILE", raising=False)
        fs = s3fs.S3FileSystem(anon=False, endpoint_url=f"http://127.0.0.1:{port}")
        fs.mkdir("cas-bucket")
        try:
            yield fs
        finally:
            server.stop()


def local(tmp_path: Path) -> tuple[Files, str]:
    return Files(storage.resolve(str(tmp_path)).fs), str(tmp_path / "store" / "x.json")


def check_semantics(files: Files, path: str) -> None:
    assert files.read(path) is None
    first = files.create(path, b"one")
    assert first is not None and files.create(path, b"other") is None
    found = files.read(path)
    assert found is not None and (found.data, found.version) == (b"one", first)
    second = files.replace(path, b"two", first)
    assert second is not None and second != first
    assert files.replace(path, b"stale", first) is None  # the version it read is gone
    assert files.delete(path, first) is False  # conditional delete of an old version
    assert files.delete(path, second) is True and files.read(path) is None
    assert files.replace(path, b"three", second) is None  # nothing to replace: gone
    # Created again with other bytes: the old version does not match the new file.
    again = files.create(path, b"again")
    assert again is not None and files.replace(path, b"late", second) is None


def test_local_files_change_only_over_the_version_read(tmp_path: Path) -> None:
    check_semantics(*local(tmp_path))


def test_s3_files_change_only_over_the_etag_read(s3: Any, tmp_path: Path) -> None:
    files = Files(s3)
    check_semantics(files, f"cas-bucket/{tmp_path.name}/x.json")


def _increment(path: str, times: int) -> int:
    """Adds 1 to the counter in `path` `times` times by read, replace, retry."""
    files = Files(storage.resolve(os.path.dirname(path)).fs)
    conflicts = 0
    for _ in range(times):
        while True:
            found = files.read(path)
            assert found is not None
            value = json.loads(found.data)["n"] + 1
            if files.replace(path, json.dumps({"n": value}).encode(), found.version):
                break
            conflicts += 1
    return conflicts


def test_racing_threads_and_processes_lose_no_update(tmp_path: Path) -> None:
    files, path = local(tmp_path)
    assert files.create(path, b'{"n": 0}') is not None
    context = multiprocessing.get_context("fork")  # before the threads start
    with (
        concurrent.futures.ProcessPoolExecutor(3, mp_context=context) as processes,
        concurrent.futures.ThreadPoolExecutor(4) as threads,
    ):
        jobs = [processes.submit(_increment, path, 40) for _ in range(3)]
        jobs += [threads.submit(_increment, path, 40) for _ in range(4)]
        conflicts = sum(job.result() for job in jobs)
    found = files.read(path)
    assert found is not None and json.loads(found.data) == {"n": 7 * 40}
    assert conflicts > 0, "the writers never raced: the test proves nothing"
