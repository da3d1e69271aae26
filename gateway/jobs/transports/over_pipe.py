"""The runner's pipe transport: the runner in a child process of the gateway (the local
executor's isolation, gateway.jobs.runner.child), its images sent over a socket to the gateway,
which runs them through its own pipeline (gateway.jobs.executors.isolated) and sends the
answers back.

A frame is `uint32 header length`, `uint32 data length`, the header (JSON), the data (an
image, or nothing). The runner sends `work` (an image), `charge` (result bytes it is about to
write), `fence` (may it commit now: does the gateway still hold the job's lease) and `end`
(how the run ended); the gateway sends `start` (the job), `answer`, `charged`, `fenced` and
`stop`. Each side bounds what it reads from the other: the gateway takes no
image over the image limit and no header over MAX_HEADER, whatever the runner became.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
from collections.abc import Callable
from typing import Any

from gateway.errors import GatewayError, Kind
from gateway.jobs.runner.budget import BudgetSpent
from gateway.jobs.runner.fence import LeaseLost, until_in_time
from gateway.jobs.runner.transport import Answer, CallTransport, Deliver, Work

_HEAD = struct.Struct("<II")
MAX_HEADER = 16 * 1024 * 1024  # a detection result with every box is far below


class ProtocolError(Exception):
    """The other side sent something that is not a frame of this protocol."""


def pack(header: dict[str, Any], data: bytes = b"") -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    return _HEAD.pack(len(text), len(data)) + text + data


async def receive(reader: asyncio.StreamReader, max_data: int) -> tuple[dict[str, Any], bytes]:
    """The next frame; IncompleteReadError when the other side is gone."""
    size, data_size = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if size > MAX_HEADER or data_size > max_data:
        raise ProtocolError(f"a frame of {size} + {data_size} bytes is over the limits")
    try:
        header = json.loads(await reader.readexactly(size))
    except ValueError as e:
        raise ProtocolError(f"a frame header that is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("a frame header that is not a JSON object")
    data = await reader.readexactly(data_size) if data_size else b""
    return header, data


class Link:
    """One side's end of the socket: frames out (one writer at a time), and the calls
    waiting for their reply (by number).

    A frame is written whole or the link is broken: a write that fails (out of memory, most
    likely, in a runner near its limit) may have put part of its frame on the socket already,
    and any frame after it would be read from the middle of that one. So the link closes
    (the other side reads the end of the stream, never a misread frame) and `on_broken`,
    if given, hears why."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_broken: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self._on_broken = on_broken
        self._lock = asyncio.Lock()
        self._numbers = itertools.count()
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.closed = False

    async def send(self, header: dict[str, Any], data: bytes = b"") -> None:
        if self.closed:
            raise ConnectionError("the other side closed the link")
        frame = pack(header, data)  # failing here, nothing is written
        async with self._lock:
            if self.closed:
                raise ConnectionError("the link is broken")
            try:
                self.writer.write(frame)
            except BaseException as e:
                self.gone()
                self.writer.transport.abort()
                if self._on_broken is not None:
                    self._on_broken(e)
                raise
            await self.writer.drain()

    async def ask(self, header: dict[str, Any], data: bytes = b"") -> dict[str, Any]:
        """Sends a frame numbered `n` and waits for the reply of that number."""
        number = next(self._numbers)
        reply = asyncio.get_running_loop().create_future()
        self.waiting[number] = reply
        try:
            await self.send({**header, "n": number}, data)
            return await reply
        finally:
            self.waiting.pop(number, None)

    def reply(self, header: dict[str, Any]) -> None:
        reply = self.waiting.get(int(header.get("n", -1)))
        if reply is not None and not reply.done():
            reply.set_result(header)

    def gone(self) -> None:
        """The other side is gone: every call waiting for a reply fails, and every call
        made from now on (a write reserving its bytes as the run stops)."""
        self.closed = True
        for reply in self.waiting.values():
            if not reply.done():
                reply.set_exception(ConnectionError("the gateway closed the batch runner's link"))


def answer_header(found: Answer | GatewayError) -> dict[str, Any]:
    """An answer (or the call's failure) as the gateway sends it."""
    if isinstance(found, GatewayError):
        return {"t": "answer", "raised": {"kind": found.kind.value, "message": found.message}}
    error = found.error
    return {
        "t": "answer",
        "result": found.result,
        "model": found.model,
        "error": None if error is None else {"kind": error.kind.value, "message": error.message},
    }


def _error(data: Any) -> GatewayError:
    return GatewayError(Kind(data["kind"]), str(data["message"]))


class PipeTransport(CallTransport):
    """The runner's side: each worker sends one image and waits for its answer."""

    def __init__(self, link: Link, concurrency: int, deliver: Deliver) -> None:
        super().__init__(
            deliver, concurrency, 600.0, "the gateway's pipeline", "the job resumes from there"
        )
        self._link = link

    async def call(self, work: Work) -> Answer:
        try:
            reply = await self._link.ask({"t": "work", "rid": work.request_id}, work.data)
        except ConnectionError:  # the gateway is gone: the run is stopped as well
            raise GatewayError(Kind.CANCELLED, "the gateway closed the runner's link") from None
        if reply.get("raised") is not None:
            raise _error(reply["raised"])
        error = reply.get("error")
        return Answer(reply.get("result"), reply.get("model"), _error(error) if error else None)


class PipeBudget:
    """The runner's side of the job's budget (gateway.jobs.runner.budget): each reservation asks
    the gateway, which holds the bound, and waits for its answer; deletions are told."""

    def __init__(self, link: Link, loop: asyncio.AbstractEventLoop) -> None:
        self._link = link
        self._loop = loop

    def reserve(self, size: int) -> None:
        ask = self._link.ask({"t": "charge", "bytes": size})
        try:
            reply = asyncio.run_coroutine_threadsafe(ask, self._loop).result()
        except ConnectionError:
            raise BudgetSpent("the gateway closed the runner's link") from None
        if not reply.get("ok"):
            raise BudgetSpent(str(reply.get("message", "")))

    def release(self, size: int) -> None:
        credit = self._link.send({"t": "credit", "bytes": size})
        asyncio.run_coroutine_threadsafe(credit, self._loop)


class PipeFence:
    """The runner's side of the job's fence (gateway.jobs.runner.fence): before each commit it asks
    the gateway, which holds the job's lease, and waits for its answer, which must come before
    the lease it names runs out."""

    def __init__(self, link: Link, loop: asyncio.AbstractEventLoop) -> None:
        self._link = link
        self._loop = loop

    def check(self) -> None:
        ask = self._link.ask({"t": "fence"})
        try:
            reply = asyncio.run_coroutine_threadsafe(ask, self._loop).result()
        except ConnectionError:
            raise LeaseLost("the gateway closed the runner's link") from None
        if not reply.get("ok"):
            raise LeaseLost(str(reply.get("message", "")))
        until_in_time(float(reply.get("until", 0)))
