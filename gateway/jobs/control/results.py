"""A job's result lines in input order, readable while it runs, resumable after any line."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from gateway import errors
from gateway.jobs.control.paging import decode_token, encode_token
from gateway.jobs.runner import progress as status
from gateway.jobs.spec.records import Job

BATCH = 256  # lines read per hop to a thread


async def read(job: Job, token: str) -> AsyncIterator[tuple[str, int, dict[str, Any], str]]:
    """(result file, line index, parsed line, token to resume after it) from the line after
    `token` on (from the first without one); stops at the first line not committed yet."""
    unit, line = 0, 0
    if token:
        position = decode_token(token, "read", id=str, u=int, l=int)
        if position.get("id") != job.id:
            raise errors.invalid_input("page_token belongs to another operation")
        unit, line = int(position["u"]), int(position["l"])
    output = job.spec.output
    found = await asyncio.to_thread(status.read, output, job.units, job.shards)
    for index in range(unit, len(found.files)):
        f = found.files[index]
        start = line if index == unit else 0
        lines = status.lines(output, f, start)
        while True:
            got = await asyncio.to_thread(_next_batch, lines, BATCH)
            if not got:
                break
            for number, parsed in got:
                after = encode_token({"k": "read", "id": job.id, "u": index, "l": number + 1})
                yield f.name, number, parsed, after
        if not f.finished:
            return  # lines after an unfinished file's committed ones are not in order yet


def _next_batch(lines: Iterator[tuple[int, dict[str, Any]]], count: int) -> list[Any]:
    batch = []
    for item in lines:
        batch.append(item)
        if len(batch) >= count:
            break
    return batch
