"""Where the payload log's events go (GATEWAY_PAYLOAD_LOG), written by its one writer thread.

- A path or `file:///path`: JSON Lines, one structured-mode event per line, appended and
  flushed event by event. When the file reaches GATEWAY_PAYLOAD_LOG_ROTATE_BYTES it is
  renamed `<name>.<UTC time><suffix>` and a new one started; rotated files are never deleted
  here (retention is the log shipper's or the operator's). With --workers above 1 each
  worker writes its own file, `<name>.w<index><suffix>`.
- Any other fsspec URL (`s3://bucket/prefix`, `gs://...`, `memory://...`): objects of JSON
  Lines under the prefix, `<UTC time>-<host>-<pid>-<n>.jsonl`, each written whole with one
  PUT once it holds GATEWAY_PAYLOAD_LOG_ROTATE_BYTES or is CHUNK_SECONDS old.
- `http://` or `https://`: one POST per event in binary mode (ce-* headers, the data as the
  body), as KServe's logger sends them, with GATEWAY_PAYLOAD_LOG_TIMEOUT for the whole call;
  a failure (no answer in time, a refused connection, a status other than 2xx) is counted
  and the event dropped, never retried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, BinaryIO

import fsspec
import urllib3
from fsspec.implementations.local import LocalFileSystem

from gateway.paylog.events import binary, structured
from gateway.paylog.sampling import PaylogError
from gateway.readiness import GROUP_COUNT_ENV, GROUP_INDEX_ENV

log = logging.getLogger("gateway.paylog")

SETTING = "GATEWAY_PAYLOAD_LOG"
# An object is written at least this often while events come, so a crash loses little.
CHUNK_SECONDS = 10.0

Event = Mapping[str, Any]


# What a write or flush settled: (events written, events failed); an object sink holds
# events until its chunk is full or due, so a write may settle none.
Settled = tuple[int, int]


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


class FileSink:
    wait = None

    def __init__(self, path: str, rotate_bytes: int) -> None:
        self.path = path
        self.rotate_bytes = rotate_bytes
        self._file: BinaryIO | None = None
        self._regular = False

    def _open(self) -> BinaryIO:
        if self._file is None:
            # Blocks on a FIFO until it has a reader: in the writer thread, never a request.
            self._file = open(self.path, "ab")  # noqa: SIM115 - kept open between batches
            self._regular = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
        return self._file

    def write(self, events: Sequence[Event]) -> Settled:
        written = 0
        try:
            for event in events:
                file = self._open()
                file.write(structured(event) + b"\n")
                file.flush()  # each event whole in the file, so `written` is what is there
                written += 1
                if self._regular and file.tell() >= self.rotate_bytes:
                    self._rotate()
        except OSError as e:
            log.error("payload log: cannot write %s: %s", self.path, e.strerror or e)
            self._close()
        return written, len(events) - written

    def _rotate(self) -> None:
        self._close()
        stem, suffix = os.path.splitext(self.path)
        os.replace(self.path, f"{stem}.{_stamp()}{suffix}")

    def _close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def due(self) -> bool:
        return False

    def flush(self) -> Settled:
        return 0, 0

    def close(self) -> None:
        self._close()


class ObjectSink:
    wait = CHUNK_SECONDS

    def __init__(self, fs: Any, prefix: str, chunk_bytes: int) -> None:
        self.fs = fs
        self.prefix = prefix
        self.chunk_bytes = chunk_bytes
        self._lines: list[bytes] = []
        self._size = 0
        self._since = 0.0
        self._count = 0
        self._name = f"{socket.gethostname()}-{os.getpid()}"

    def write(self, events: Sequence[Event]) -> Settled:
        written = failed = 0
        for event in events:
            if not self._lines:
                self._since = time.monotonic()
            line = structured(event) + b"\n"
            self._lines.append(line)
            self._size += len(line)
            if self._size >= self.chunk_bytes:  # an object at most one event over the size
                done, lost = self.flush()
                written, failed = written + done, failed + lost
        return written, failed

    def due(self) -> bool:
        return bool(self._lines) and time.monotonic() - self._since >= CHUNK_SECONDS

    def flush(self) -> Settled:
        if not self._lines:
            return 0, 0
        lines, self._lines, self._size = self._lines, [], 0
        self._count += 1
        path = posixpath.join(self.prefix, f"{_stamp()}-{self._name}-{self._count:06d}.jsonl")
        try:
            self.fs.pipe_file(path, b"".join(lines))
        except Exception as e:  # any store error (fsspec backends raise their own kinds)
            log.error("payload log: cannot write %s: %s", self.fs.unstrip_protocol(path), e)
            return 0, len(lines)
        return len(lines), 0

    def close(self) -> None:
        self.flush()


class HttpSink:
    wait = None

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self._pool = urllib3.PoolManager(
            retries=False, timeout=urllib3.Timeout(total=timeout), maxsize=1
        )
        self._failing = False

    def write(self, events: Sequence[Event]) -> Settled:
        written = 0
        for event in events:
            headers, body = binary(event)
            try:
                response = self._pool.request("POST", self.url, body=body, headers=headers)
                ok = 200 <= response.status < 300
                problem = f"status {response.status}"
            except urllib3.exceptions.HTTPError as e:
                ok, problem = False, str(e)
            if ok:
                written += 1
                self._failing = False
            elif not self._failing:  # once per run of failures, not per event
                self._failing = True
                log.error("payload log: POST %s failed: %s", self.url, problem)
        return written, len(events) - written

    def due(self) -> bool:
        return False

    def flush(self) -> Settled:
        return 0, 0

    def close(self) -> None:
        self._pool.clear()


AnySink = FileSink | ObjectSink | HttpSink


def open_sink(
    target: str, rotate_bytes: int, timeout: float, environ: Mapping[str, str] | None = None
) -> AnySink:
    """The sink GATEWAY_PAYLOAD_LOG names; PaylogError naming the setting when it cannot be."""
    environ = os.environ if environ is None else environ
    scheme = target.split("://", 1)[0].lower() if "://" in target else ""
    if scheme in ("http", "https"):
        parsed = urllib3.util.parse_url(target)
        if not parsed.host:
            raise PaylogError(f"{SETTING}={target!r}: the URL has no host")
        return HttpSink(target, timeout)
    try:
        fs, path = fsspec.core.url_to_fs(target)
    except (ImportError, ValueError) as e:
        raise PaylogError(f"{SETTING}={target!r}: cannot be opened: {e}") from None
    if not isinstance(fs, LocalFileSystem):
        return ObjectSink(fs, path.rstrip("/"), rotate_bytes)
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise PaylogError(f"{SETTING}={target!r} is a directory; name the log file in it")
    if not os.path.isdir(os.path.dirname(path)):
        raise PaylogError(f"{SETTING}={target!r}: directory {os.path.dirname(path)} not found")
    count = int(environ.get(GROUP_COUNT_ENV, "1") or 1)
    if count > 1:  # one file per worker process: no interleaving, no racing rotations
        stem, suffix = os.path.splitext(path)
        path = f"{stem}.w{environ.get(GROUP_INDEX_ENV, '0')}{suffix}"
    return FileSink(path, rotate_bytes)
