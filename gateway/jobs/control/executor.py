"""What the job service asks of an executor (gateway.jobs.executors: local, kubernetes): start
the unfinished jobs it owns, submit, cancel, delete, refresh a job's state, close."""

from __future__ import annotations

from typing import Protocol

from gateway.jobs.spec.records import Job


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
