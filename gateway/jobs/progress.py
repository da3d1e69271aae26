"""What a job's output prefix says: counts so far, shard markers, result lines in order.

Read-only over the runner's layout (gateway.batch.output): a finished result file has its
counts in `_batch/done/<file>.json`; an unfinished one has committed parts
`_batch/parts/<file>/<A>-<B>.jsonl` (a header line with their counts, then lines [A, B)).
Only parts chaining from line 0 count, as the runner's resume does.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.batch import storage
from gateway.batch.output import STATE, shard_marker

_PART = re.compile(r"^(\d{12})-(\d{12})\.jsonl$")


@dataclass
class FileProgress:
    name: str
    shard: int
    finished: bool
    lines: int
    codes: Counter[str]
    parts: list[tuple[int, str]] = field(default_factory=list)  # (first line, path) chain


@dataclass
class Progress:
    files: list[FileProgress]
    shards_done: list[bool]

    @property
    def processed(self) -> int:
        return sum(f.lines for f in self.files)

    @property
    def failed(self) -> int:
        return sum(f.lines - f.codes.get("OK", 0) for f in self.files)

    @property
    def codes(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for f in self.files:
            total.update(f.codes)
        return total

    def shard(self, index: int) -> tuple[int, int]:
        lines = [f for f in self.files if f.shard == index]
        return sum(f.lines for f in lines), sum(f.lines - f.codes.get("OK", 0) for f in lines)


def _chain(fs: Any, directory: str) -> list[tuple[int, int, str]]:
    spans: dict[int, tuple[int, str]] = {}
    for path in storage.listing(fs, directory):
        match = _PART.match(posixpath.basename(path))
        if match:
            start, end = int(match.group(1)), int(match.group(2))
            if end > spans.get(start, (-1, ""))[0]:
                spans[start] = (end, path)
    chain = []
    position = 0
    while position in spans:
        end, path = spans[position]
        chain.append((position, end, path))
        position = end
    return chain


def _header(fs: Any, path: str) -> Counter[str]:
    with fs.open(path, "rb") as f:
        return Counter(json.loads(f.readline()).get("codes", {}))


def read(output_url: str, units: list[list[Any]], shards: int) -> Progress:
    """Counts of every result file and which shards have their marker (blocking I/O)."""
    location = storage.resolve(output_url)
    fs = location.fs
    files = []
    for shard, name in units:
        done_path = location.child(posixpath.join(STATE, "done", name + ".json"))
        if storage.exists(fs, location.child(name)) and storage.exists(fs, done_path):
            codes = Counter(json.loads(storage.read_bytes(fs, done_path)).get("codes", {}))
            files.append(FileProgress(name, shard, True, sum(codes.values()), codes))
            continue
        codes = Counter()
        lines = 0
        paths: list[tuple[int, str]] = []
        for start, end, path in _chain(fs, location.child(posixpath.join(STATE, "parts", name))):
            try:
                codes.update(_header(fs, path))
            except (FileNotFoundError, ValueError):
                break  # finished and cleaned up meanwhile: counted on the next read
            lines = end
            paths.append((start, path))
        files.append(FileProgress(name, shard, False, lines, codes, paths))
    markers = [storage.exists(fs, location.child(shard_marker(i))) for i in range(shards)]
    return Progress(files, markers)


def first_line_with(output_url: str, progress: Progress, code: str) -> dict[str, Any] | None:
    """The first committed line (input order) whose error code is `code`."""
    for f in progress.files:
        if f.codes.get(code, 0) == 0:
            continue
        for _, line in lines(output_url, f, 0):
            if line.get("error", {}).get("code") == code:
                return line
    return None


def lines(output_url: str, f: FileProgress, start: int) -> Iterator[tuple[int, dict[str, Any]]]:
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
