"""The jobs API's edges, on the service every door calls (in-process, against the local TF
Serving): WaitOperation with no deadline returns at the default limit; crafted page tokens
are INVALID_ARGUMENT; a filter that matches nothing reads no finished record (each caller has
an index); finished operations per caller are capped."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway import policy
from gateway.app import build_jobs, built_in_tasks
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline
from gateway.errors import GatewayError, Kind
from gateway.jobs.control import service as service_module
from gateway.jobs.control.service import JobService
from gateway.jobs.spec import JobSpec
from gateway.jobs.spec.views import CreateJob
from gateway.models import default_registry
from gateway.tasks.builtin import BUILT_IN
from gateway.upstream.client import TFServingClient
from tests.support.jobs import make_images
from tests.support.localserver import LocalServer

ALICE = "spiffe://test/alice"


@asynccontextmanager
async def jobs_service(
    tfs: LocalServer, tmp_path: Path, **settings: Any
) -> AsyncIterator[JobService]:
    """The job service as the gateway builds it; batch work paused (jobs wait, QUEUED or
    RUNNING without progress) so the tests decide when a job ends."""
    images = tmp_path / "images"
    make_images(images, 2)
    config = Settings(
        upstream=tfs.target,
        job_store=str(tmp_path / "store"),
        batch_allowed_input_uris=str(images),
        batch_yield_threshold=0,
        **settings,
    )
    client = TFServingClient(config)
    with ThreadPoolExecutor(1) as executor:
        models = default_registry("detector", default_task="detection")
        pipeline = Pipeline(
            config, client, models, executor, built_in_tasks(), policy.build(config, models)
        )
        jobs = build_jobs(config, Cascades(pipeline, {}), BUILT_IN)
        await jobs.start()
        try:
            yield jobs
        finally:
            await jobs.close()
            await client.close()


def request(tmp_path: Path) -> CreateJob:
    return CreateJob(JobSpec(input=str(tmp_path / "images"), output="", task="detection"))


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 120))


def test_wait_without_a_deadline_returns_at_the_default_limit(
    tfs: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "MAX_WAIT_SECONDS", 0.3)

    async def test() -> None:
        async with jobs_service(tfs, tmp_path) as jobs:
            job = await jobs.create(ALICE, request(tmp_path))
            for timeout in (None, 1e9):  # none given (gRPC without a deadline), or too long
                view = await jobs.wait(ALICE, job.name, timeout)
                assert not view.job.done

    run(test)


def token(data: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


CRAFTED = [
    "%%%",
    "e30",  # {}
    token({"k": "list"}),
    token({"k": "list", "t": "yesterday", "id": "x"}),
    token({"k": "list", "t": 1, "id": 7}),
    token({"k": "list", "t": [1], "id": "x"}),
    token({"k": "list", "t": True, "id": "x"}),
    token([1, 2]),
    "A" * 5000,
    base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    base64.urlsafe_b64encode(b"[" * 100_000).decode(),
]
CRAFTED_READ = [
    token({"k": "read", "id": "ID"}),
    token({"k": "read", "id": "ID", "u": "0", "l": 0}),
    token({"k": "read", "id": "ID", "u": 0, "l": -1}),
    token({"k": "read", "id": "ID", "u": 0, "l": 1e300}),
    token({"k": "read", "id": "other", "u": 0, "l": 0}),
]


def test_crafted_page_tokens_are_invalid_arguments(tfs: LocalServer, tmp_path: Path) -> None:
    async def test() -> None:
        async with jobs_service(tfs, tmp_path) as jobs:
            job = await jobs.create(ALICE, request(tmp_path))
            for crafted in CRAFTED:
                with pytest.raises(GatewayError) as info:
                    await jobs.list(ALICE, "", 10, crafted)
                assert info.value.kind is Kind.INVALID_INPUT, crafted
            for crafted in CRAFTED_READ:
                crafted = _with_id(crafted, job.id)
                with pytest.raises(GatewayError) as info:
                    async for _ in jobs.read(ALICE, job.name, crafted):
                        pass
                assert info.value.kind is Kind.INVALID_INPUT, crafted

    run(test)


def _with_id(crafted: str, job_id: str) -> str:
    padded = crafted + "=" * (-len(crafted) % 4)
    data = json.loads(base64.urlsafe_b64decode(padded))
    if data["id"] == "ID":
        data["id"] = job_id
    return token(data)


def test_a_filter_that_matches_nothing_reads_no_finished_record(
    tfs: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test() -> None:
        async with jobs_service(tfs, tmp_path) as jobs:
            names = []
            for _ in range(5):
                job = await jobs.create(ALICE, request(tmp_path))
                await jobs.cancel(ALICE, job.name)
                assert (await jobs.wait(ALICE, job.name, 30)).job.state == "CANCELLED"
                names.append(job.name)
            await asyncio.wait_for(_index_settled(jobs, ALICE), 30)
            reads: list[str] = []
            load = jobs.store.load

            def counted(job_id: str, deleted: bool = False) -> Any:
                reads.append(job_id)
                return load(job_id, deleted)

            monkeypatch.setattr(jobs.store, "load", counted)
            views, next_token = await jobs.list(ALICE, "state=SUCCEEDED OR state=RUNNING", 10, "")
            assert (views, next_token, reads) == ([], "", [])
            views, next_token = await jobs.list(ALICE, "done=true", 2, "")
            assert [v.job.name for v in views] == names[:2] and len(reads) == 2
            views, _ = await jobs.list(ALICE, "done=true", 10, next_token)
            assert [v.job.name for v in views] == names[2:]
            assert (await jobs.list("spiffe://test/bob", "", 10, ""))[0] == []

    run(test)


async def _index_settled(jobs: JobService, caller: str) -> None:
    """Until the caller's index holds every job's final state: it is written just after the
    record that ended the job, and an entry still unfinished makes a listing read the record
    (the record is the truth), which is right but not what the test counts."""
    while any(not state for _, state in jobs.store.index.entries(caller).values()):
        await asyncio.sleep(0.01)


def test_finished_operations_per_caller_are_capped(tfs: LocalServer, tmp_path: Path) -> None:
    async def test() -> None:
        async with jobs_service(tfs, tmp_path, batch_max_finished_per_caller=2) as jobs:
            ended = []
            for _ in range(2):
                job = await jobs.create(ALICE, request(tmp_path))
                await jobs.cancel(ALICE, job.name)
                await jobs.wait(ALICE, job.name, 30)
                ended.append(job)
            with pytest.raises(GatewayError) as info:
                await jobs.create(ALICE, request(tmp_path))
            assert info.value.kind is Kind.OVERLOADED
            assert "GATEWAY_BATCH_MAX_FINISHED_PER_CALLER" in info.value.message
            await jobs.create("spiffe://test/bob", request(tmp_path))  # another caller's own
            await jobs.delete(ALICE, ended[0].name)
            await jobs.create(ALICE, request(tmp_path))  # room again; nothing was removed
            assert await jobs.get(ALICE, ended[1].name)

    run(test)
