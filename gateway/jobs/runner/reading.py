"""Reading untrusted dataset files with bounded memory: a stream that counts the bytes it
hands out (after decompression) and stops at the limit, and lines split from fixed-size
chunks, each line capped (fsspec's buffered files read a whole line, however long, so
`readline` is never used).

Decompression (`.gz`, `.bz2`, `.xz`, `.zst`) is streamed: the standard library's readers
inflate at most what `read(n)` asks for, so a 65 KB file that inflates to gigabytes costs
one chunk of memory at a time and stops at GATEWAY_BATCH_MAX_DECOMPRESSED_BYTES.
"""

from __future__ import annotations

import contextlib
import lzma
import zlib
from collections.abc import Iterator
from typing import IO, Any

import fsspec

from gateway.jobs.runner.dataset_limits import Limits

CHUNK = 1 << 20  # bytes per read
# What reading a file may raise besides its own limits: storage trouble, and compressed data
# that is damaged or cut short.
DAMAGED = (OSError, EOFError, zlib.error, lzma.LZMAError)


class BoundedStream:
    """`read(n)` over a (decompressing) stream, raising LimitExceeded once more than
    `limit` bytes came out of it."""

    def __init__(self, stream: IO[bytes], limit: int, url: str, limits: Limits) -> None:
        self._stream = stream
        self._limit = limit
        self._url = url
        self._limits = limits
        self.position = 0  # bytes handed out so far

    def read(self, size: int) -> bytes:
        if size < 0:
            raise ValueError("a bounded stream reads a given number of bytes")
        if size == 0:
            return b""
        data = self._stream.read(min(size, self._limit + 1 - self.position))
        self.position += len(data)
        if self.position > self._limit:
            raise self._limits.inflates_too_much(self._url)
        return data


@contextlib.contextmanager
def open_bounded(fs: Any, path: str, url: str, limits: Limits) -> Iterator[BoundedStream]:
    """The file at `path` on `fs`, decompressed by its suffix, read through a BoundedStream."""
    compression = fsspec.utils.infer_compression(path)
    with fs.open(path, "rb") as raw:
        if compression is None:
            yield BoundedStream(raw, limits.max_decompressed_bytes, url, limits)
            return
        opener = fsspec.compression.compr.get(compression)
        if opener is None:  # a codec this install lacks (zstd): the bytes as they are
            yield BoundedStream(raw, limits.max_decompressed_bytes, url, limits)
            return
        with opener(raw, mode="rb") as inflated:
            yield BoundedStream(inflated, limits.max_decompressed_bytes, url, limits)


def lines(stream: BoundedStream, max_line: int) -> Iterator[bytes | None]:
    """The lines of `stream` without their newline, in order; None for a line longer than
    `max_line` (its bytes are skipped, never held). A last line without a newline counts; an
    empty stream has no lines."""
    held = bytearray()
    skipping = False
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            if skipping:
                yield None
            elif held:
                yield bytes(held)
            return
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                if not skipping:
                    held += chunk[start:]
                    if len(held) > max_line:
                        skipping = True
                        held.clear()
                break
            if skipping:
                skipping = False
                yield None
            elif held or newline - start > max_line:
                held += chunk[start:newline]
                yield bytes(held) if len(held) <= max_line else None
                held.clear()
            else:
                yield chunk[start:newline]
            start = newline + 1


def count_lines(stream: BoundedStream) -> int:
    """Lines in `stream` (as `lines` yields them), counted at C speed in chunks."""
    count = 0
    last = b"\n"
    while chunk := stream.read(CHUNK):
        count += chunk.count(b"\n")
        last = chunk[-1:]
    return count + (last != b"\n")
