"""The pipe between the local executor's runner and its gateway (gateway.jobs.transports.over_pipe):
frames bounded on reading, answers and failures carried back, the budget asked over it."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from gateway.errors import GatewayError, Kind
from gateway.jobs.runner.budget import BudgetSpent
from gateway.jobs.runner.transport import Answer, Work
from gateway.jobs.transports.over_pipe import (
    MAX_HEADER,
    Link,
    PipeBudget,
    PipeTransport,
    ProtocolError,
    answer_header,
    pack,
    receive,
)


async def pair() -> tuple[Link, Link]:
    ours, theirs = socket.socketpair()
    a = Link(*await asyncio.open_unix_connection(sock=ours))
    b = Link(*await asyncio.open_unix_connection(sock=theirs))
    return a, b


def test_frames_over_their_limits_are_refused_before_they_are_read() -> None:
    async def run() -> None:
        for head, data, limit in (
            ({"t": "work"}, b"x" * 101, 100),  # an image over the limit
            ({"t": "x" * 64}, b"", 100),
        ):
            reader = asyncio.StreamReader()
            frame = pack(head, data)
            if len(head["t"]) == 64:  # a header announcing more than MAX_HEADER
                frame = struct.pack("<II", MAX_HEADER + 1, 0)
            reader.feed_data(frame)
            with pytest.raises(ProtocolError, match="over the limits"):
                await receive(reader, limit)
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack("<II", 3, 0) + b"[1]")
        with pytest.raises(ProtocolError, match="not a JSON object"):
            await receive(reader, 100)
        reader = asyncio.StreamReader()
        reader.feed_data(pack({"t": "work", "n": 1}, b"img"))
        assert await receive(reader, 100) == ({"t": "work", "n": 1}, b"img")

    asyncio.run(run())


def test_answers_and_call_failures_come_back_to_the_runners_calls() -> None:
    async def run() -> list[Any]:
        runner, gateway = await pair()

        async def serve() -> None:
            for found in (
                Answer({"detections": []}, "detector@1", None),
                Answer(None, None, GatewayError(Kind.TOO_LARGE, "too big")),
                GatewayError(Kind.OVERLOADED, "full"),
            ):
                header, data = await receive(gateway.reader, 100)
                assert header["t"] == "work" and data == b"img"
                await gateway.send({**answer_header(found), "n": header["n"]})

        async def listen() -> None:
            while True:
                header, _ = await receive(runner.reader, 0)
                runner.reply(header)

        server, listener = asyncio.create_task(serve()), asyncio.create_task(listen())
        transport = PipeTransport(runner, 1, lambda *_: None)
        got: list[Any] = []
        for _ in range(3):
            try:
                got.append(await transport.call(Work(0, b"img", "r", None)))
            except GatewayError as e:
                got.append(e)
        await server
        listener.cancel()
        return got

    ok, per_item, raised = asyncio.run(run())
    assert ok == Answer({"detections": []}, "detector@1", None)
    assert per_item.error.kind is Kind.TOO_LARGE and per_item.error.message == "too big"
    assert isinstance(raised, GatewayError) and raised.kind is Kind.OVERLOADED


def test_the_budget_is_asked_from_a_thread_and_a_refusal_names_why() -> None:
    async def run() -> tuple[list[int], str]:
        runner, gateway = await pair()
        credits: list[int] = []
        credited = asyncio.Event()

        async def serve() -> None:
            while True:
                header, _ = await receive(gateway.reader, 0)
                if header["t"] == "credit":
                    credits.append(header["bytes"])
                    credited.set()
                    continue
                ok = header["bytes"] <= 10
                reply = {"t": "charged", "n": header["n"], "ok": ok, "message": "store full"}
                await gateway.send(reply)

        async def listen() -> None:
            while True:
                header, _ = await receive(runner.reader, 0)
                runner.reply(header)

        tasks = [asyncio.create_task(serve()), asyncio.create_task(listen())]
        budget = PipeBudget(runner, asyncio.get_running_loop())
        await asyncio.to_thread(budget.reserve, 10)
        with pytest.raises(BudgetSpent) as info:
            await asyncio.to_thread(budget.reserve, 11)
        budget.release(7)
        await asyncio.wait_for(credited.wait(), 30)
        for task in tasks:
            task.cancel()
        return credits, str(info.value)

    credits, refusal = asyncio.run(run())
    assert credits == [7] and refusal == "store full"


def test_a_frame_cut_by_a_failed_write_breaks_the_link_instead_of_misleading_the_reader() -> None:
    """Near its memory limit, asyncio's write can put part of a frame on the socket and then
    fail (copying the rest raises MemoryError). Nothing may follow that part: the other side
    would read the next frame's bytes from the middle of an image (CI saw `a frame header
    that is not JSON`, and the runner's death misnamed as a protocol break)."""

    async def run() -> tuple[list[BaseException], type[BaseException], type[BaseException]]:
        ours, theirs = socket.socketpair()
        heard: list[BaseException] = []
        runner = Link(*await asyncio.open_unix_connection(sock=ours), on_broken=heard.append)
        gateway = Link(*await asyncio.open_unix_connection(sock=theirs))
        sock = ours  # the socket under the transport

        def half_then_out_of_memory(frame: bytes) -> None:
            sock.send(frame[: len(frame) // 2])
            raise MemoryError

        runner.writer.transport.write = half_then_out_of_memory  # type: ignore[method-assign]
        with pytest.raises(MemoryError):
            await runner.send({"t": "work", "n": 0}, bytes(1000))
        with pytest.raises(ConnectionError) as second:
            await runner.send({"t": "work", "n": 1}, bytes(1000))
        with pytest.raises(Exception) as read:
            await receive(gateway.reader, 10_000)
        return heard, second.type, read.type

    heard, second, read = asyncio.run(run())
    assert [type(e) for e in heard] == [MemoryError]
    assert second is ConnectionError
    assert read is asyncio.IncompleteReadError  # the end of the stream, not a misread frame
