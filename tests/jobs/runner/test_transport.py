"""The work queue both runner transports share (gateway.jobs.runner.transport): no image is
lost however a worker waiting for work is stopped."""

from __future__ import annotations

import asyncio

from gateway.jobs.runner.transport import Queue, Work


class _Queue(Queue):
    def workers(self) -> int:
        return 0


def test_work_taken_as_its_waiter_is_cancelled_goes_back_to_the_queue() -> None:
    """A stream's sender waits in next(); its stream ends (a refusal) and the sender is
    cancelled in the same turn as an image arrives. The image, already taken off the queue
    for the sender, must be there for the next worker: CI saw a job's one image never sent
    and the runner wait for it forever (tests/jobs/runner/test_e2e.py, overloaded gateway)."""

    async def run() -> list[int]:
        queue = _Queue(lambda *_: None, 60.0, "the gateway", "resume")
        waiter = asyncio.create_task(queue.next())
        await asyncio.sleep(0)  # waiting for work
        queue.submit(Work(7, b"img", "r7", None))
        await asyncio.sleep(0)  # the queue hands the image over ...
        waiter.cancel()  # ... as the sender is stopped
        await asyncio.gather(waiter, return_exceptions=True)
        queue.drain()
        found = []
        while (work := await queue.next()) is not None:
            found.append(work.seq)
        return found

    assert asyncio.run(run()) == [7]
