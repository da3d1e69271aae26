"""What an output prefix says about a job: counts so far, shard markers, result lines in
input order. Read-only, over the layout of gateway.jobs.runner.output and with its one reader of
committed parts (`committed`), so progress counts exactly the lines a resumed run keeps.
"""

from __future__ import annotations

import json
import posixpath
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.jobs.runner import storage
from gateway.jobs.runner.output import STATE, committed, shard_marker


@dataclass
class FileStatus:
    """One result file: finished, or how many of its lines are committed."""

    name: str
    shard: int
    finished: bool
    lines: int
    codes: Counter[str]
    parts: list[tuple[int, str]] = field(default_factory=list)  # (first line, path) chain

    @property
    def failed(self) -> int:
        return self.lines - self.codes.get("OK", 0)


@dataclass
class OutputStatus:
    files: list[FileStatus]
    shards_done: list[bool]

    @property
    def processed(self) -> int:
        return sum(f.lines for f in self.files)

    @property
    def failed(self) -> int:
        return sum(f.failed for f in self.files)

    @property
    def codes(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for f in self.files:
            total.update(f.codes)
        return total

    def shard(self, index: int) -> tuple[int, int]:
        """(lines, failed lines) of one shard."""
        files = [f for f in self.files if f.shard == index]
        return sum(f.lines for f in files), sum(f.failed for f in files)


def read(output_url: str, units: list[tuple[int, str]], shards: int) -> OutputStatus:
    """Counts of every result file (`units`: (shard, file) in input order) and which shards
    have their marker (blocking I/O)."""
    location = storage.resolve(output_url)
    fs = location.fs
    files = []
    for shard, name in units:
        done_path = location.child(posixpath.join(STATE, "done", name + ".json"))
        if storage.exists(fs, location.child(name)) and storage.exists(fs, done_path):
            codes = Counter(json.loads(storage.read_bytes(fs, done_path)).get("codes", {}))
            files.append(FileStatus(name, shard, True, sum(codes.values()), codes))
            continue
        found = committed(fs, location.child(posixpath.join(STATE, "parts", name)))
        files.append(
            FileStatus(name, shard, False, found.lines, Counter(found.counts.codes), found.parts)
        )
    markers = [storage.exists(fs, location.child(shard_marker(i))) for i in range(shards)]
    return OutputStatus(files, markers)


def first_line_with(output_url: str, status: OutputStatus, code: str) -> dict[str, Any] | None:
    """The first committed line (input order) whose error code is `code`."""
    for f in status.files:
        if f.codes.get(code, 0) == 0:
            continue
        for _, line in lines(output_url, f, 0):
            if line.get("error", {}).get("code") == code:
                return line
    return None


def lines(output_url: str, f: FileStatus, start: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, parsed line) of one result file's committed lines from `start` on."""
    location = storage.resolve(output_url)
    fs = location.fs
    if f.finished:
        sources = [(0, location.child(f.name), False)]
    else:
        sources = [(first, path, True) for first, path in f.parts]
    for first, path, has_header in sources:
        try:
            handle = fs.open(path, "rb")
        except FileNotFoundError:
            return  # the parts were merged into the finished file meanwhile
        with handle:
            if has_header:
                handle.readline()
            index = first
            for raw in handle:
                if index >= start:
                    yield index, json.loads(raw)
                index += 1
