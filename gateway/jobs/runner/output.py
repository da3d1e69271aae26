"""OUTPUT: result files, checkpoints, shard and job markers, summary (see gateway.jobs.runner).

Layout under OUTPUT:

    <unit>.jsonl                      finished output files (written once, atomically)
    _SUCCESS.SSSSS                    shard SSSSS finished (its counts, as JSON)
    _SUCCESS, summary.json            every shard finished (the job's counts)
    _batch/job.json                   the arguments that shape the results, checked on resume
    _batch/shard-SSSSS.json           when the shard first started
    _batch/parts/<unit>/AAAAAAAAAAAA-BBBBBBBBBBBB.jsonl
                                      committed lines [A, B) of an unfinished output file:
                                      one header line (their counts), then the lines
    _batch/done/<unit>.json           counts of a finished output file (written just before it)
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gateway.jobs.runner import storage
from gateway.jobs.runner.budget import Budget
from gateway.jobs.runner.fence import Fence, LeaseLost
from gateway.jobs.runner.storage import Location

STATE = "_batch"
_PART = re.compile(r"^(\d{12})-(\d{12})\.jsonl$")
_HEADER_READ = 64 * 1024  # a part's header line (its counts) is read alone, and fits in this


@dataclass
class Counts:
    """Lines per status code name ("OK" for results) and per model@version that served."""

    codes: Counter[str] = field(default_factory=Counter)
    models: Counter[str] = field(default_factory=Counter)

    def add(self, other: Counts) -> None:
        self.codes.update(other.codes)
        self.models.update(other.models)

    @property
    def total(self) -> int:
        return sum(self.codes.values())

    def to_json(self) -> dict[str, Any]:
        return {"codes": dict(sorted(self.codes.items())), "models": dict(self.models)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(Counter(data.get("codes", {})), Counter(data.get("models", {})))


def shard_marker(index: int) -> str:
    return f"_SUCCESS.{index:05d}"


class Output:
    """The OUTPUT prefix and the runner's state in it; with a budget, every byte written is
    reserved in it first (BudgetSpent: not written) and every byte deleted given back; with
    a fence, every write and deletion is preceded by its check (LeaseLost: not made)."""

    def __init__(
        self, location: Location, budget: Budget | None = None, fence: Fence | None = None
    ) -> None:
        self.location = location
        self.fs = location.fs
        self.budget = budget
        self.fence = fence

    def check_fence(self) -> None:
        """Before a commit: LeaseLost when this run may not write any more."""
        if self.fence is not None:
            self.fence.check()

    def _reserve(self, size: int) -> None:
        """Takes the write's bytes from the budget, then checks the fence: last, right before
        the write, since a reservation may wait (it asks the gateway, which may be stalled
        while another process takes the job) and a fence passed before that wait would let
        a run that lost its lease write after it."""
        if self.budget is not None:
            self.budget.reserve(size)
        try:
            self.check_fence()
        except LeaseLost:
            if self.budget is not None:
                self.budget.release(size)
            raise

    def _delete(self, paths: list[str]) -> None:
        """Deletes files this runner wrote, giving their bytes back."""
        if not paths:
            return
        self.check_fence()
        if self.budget is not None:
            self.budget.release(sum(size for _, size in self._sizes(paths)))
        storage.delete(self.fs, paths)

    def _sizes(self, paths: list[str]) -> list[tuple[str, int]]:
        """The sizes of `paths` that exist: one listing per directory (a LIST on an object
        store, not a HEAD per file)."""
        listed: dict[str, int] = {}
        for directory in sorted({posixpath.dirname(p) for p in paths}):
            listed.update(storage.sized_listing(self.fs, directory))
        return [(p, listed[p]) for p in paths if p in listed]

    def path(self, relative: str) -> str:
        return self.location.child(relative)

    def exists(self, relative: str) -> bool:
        return storage.exists(self.fs, self.path(relative))

    def read_json(self, relative: str) -> Any:
        return json.loads(storage.read_bytes(self.fs, self.path(relative)))

    def write_json(self, relative: str, data: Any) -> None:
        text = (json.dumps(data, indent=2, sort_keys=False) + "\n").encode()
        self._reserve(len(text))
        storage.write_atomic(self.fs, self.path(relative), text)

    # --- output files and their committed parts ------------------------------------------

    def parts_dir(self, unit: str) -> str:
        return self.path(posixpath.join(STATE, "parts", unit))

    def resume_point(self, unit: str) -> tuple[int, list[str], Counts]:
        """Lines of `unit` already committed: (next index, part paths in order, counts).

        Parts off the chain (left by a duplicate process that cut its parts elsewhere) and
        temporaries are deleted.
        """
        directory = self.parts_dir(unit)
        storage.remove_temporaries(self.fs, directory)
        found = committed(self.fs, directory, verify=True)
        self._delete(found.stray)
        return found.lines, [path for _, path in found.parts], found.counts

    def commit_part(self, unit: str, start: int, lines: list[bytes], counts: Counts) -> str:
        name = f"{start:012d}-{start + len(lines):012d}.jsonl"
        path = posixpath.join(self.parts_dir(unit), name)
        data = json.dumps(counts.to_json()).encode() + b"\n" + b"".join(lines)
        self._reserve(len(data))
        storage.write_atomic(self.fs, path, data)
        return path

    def finish_unit(self, unit: str, parts: list[str], counts: Counts) -> None:
        """Counts first, then the output file (atomic), then the parts go."""
        self.write_json(posixpath.join(STATE, "done", unit + ".json"), counts.to_json())
        self._reserve(sum(size for _, size in self._sizes(parts)))  # its parts, once more
        storage.write_atomic_parts(self.fs, self.path(unit), parts, skip_first_line=True)
        self.clean_unit(unit)

    def unit_done(self, unit: str) -> Counts | None:
        """Counts of a finished output file, or None when it is not finished."""
        if not self.exists(unit):
            return None
        return Counts.from_json(self.read_json(posixpath.join(STATE, "done", unit + ".json")))

    def remove_temporaries(self, shard: int, units: list[str], alone: bool) -> None:
        """Temporaries that killed runs of this shard left next to the files it writes
        (local disks; an object store has none). Files other shards write too (job.json,
        summary.json, _SUCCESS) only when the job has one shard: another shard may be
        writing them right now."""
        targets = {
            self.path(shard_marker(index=shard)),
            self.path(f"{STATE}/shard-{shard:05d}.json"),
        }
        for unit in units:
            targets.add(self.path(unit))
            targets.add(self.path(posixpath.join(STATE, "done", unit + ".json")))
        if alone:
            targets |= {
                self.path("summary.json"),
                self.path("_SUCCESS"),
                self.path(f"{STATE}/job.json"),
            }
        self.check_fence()  # the new holder's temporaries are not this run's to remove
        by_directory: dict[str, set[str]] = {}
        for target in targets:
            by_directory.setdefault(posixpath.dirname(target), set()).add(
                posixpath.basename(target)
            )
        for directory, names in sorted(by_directory.items()):
            storage.remove_temporaries(self.fs, directory, names)

    def clean_unit(self, unit: str) -> None:
        """Parts left when a run was killed between writing the output and deleting them."""
        directory = self.parts_dir(unit)
        self._delete(storage.listing(self.fs, directory))
        self.check_fence()
        storage.remove_empty_dir(self.fs, directory)


@dataclass
class Committed:
    """The committed lines of one unfinished output file."""

    lines: int  # lines [0, lines) are committed
    parts: list[tuple[int, str]]  # (first line, path) of the chain, in order
    counts: Counts
    stray: list[str]  # parts off the chain


# Headers of parts already read, by (filesystem, path, size): a part is never changed once
# written, and its size tells a part written again under the same name by another job apart.
_HEADERS: dict[tuple[str, str, int], Counts] = {}
_MAX_HEADERS = 100_000


def read_header(fs: Any, path: str, size: int | None = None) -> Counts | None:
    """A part's header (the counts of its lines); None when the part is gone or damaged."""
    key = (type(fs).__name__, path, size) if size is not None else None
    if key is not None and key in _HEADERS:
        return _HEADERS[key]
    try:
        head = fs.cat_file(path, start=0, end=_HEADER_READ)
        newline = head.find(b"\n")  # none within the bound: not a part this runner wrote
        header = Counts.from_json(json.loads(head[:newline])) if newline >= 0 else None
    except FileNotFoundError:
        return None
    except (ValueError, AttributeError):
        return None
    if key is not None and header is not None:
        if len(_HEADERS) >= _MAX_HEADERS:
            _HEADERS.clear()
        _HEADERS[key] = header
    return header


def _whole_part(fs: Any, path: str, lines: int) -> bool:
    """The part holds its header and exactly `lines` lines, the last one ended."""
    try:
        data = storage.read_bytes(fs, path)
    except FileNotFoundError:
        return False
    return data.endswith(b"\n") and data.count(b"\n") == lines + 1


def committed(fs: Any, directory: str, verify: bool = False) -> Committed:
    """The parts in `directory` that chain from line 0: from each start, the longest part
    whose header counts as many lines as its name spans (with `verify`, also holding as many:
    a resumed run reads each part whole, a look at progress reads headers only). The one
    reader of the part layout, for resuming a run and for showing a job's progress."""
    spans: dict[int, list[tuple[int, str, int]]] = {}
    for path, size in storage.sized_listing(fs, directory):
        match = _PART.match(posixpath.basename(path))
        if match:
            start, end = int(match.group(1)), int(match.group(2))
            spans.setdefault(start, []).append((end, path, size))
    chain: list[tuple[int, str]] = []
    counts = Counts()
    position = 0
    while position in spans:
        for end, path, size in sorted(spans[position], reverse=True):
            header = read_header(fs, path, size) if end > position else None
            if header is None or header.total != end - position:
                continue
            if not verify or _whole_part(fs, path, end - position):
                break
        else:
            break
        counts.add(header)
        chain.append((position, path))
        position = end
    used = {path for _, path in chain}
    stray = [p for group in spans.values() for _, p, _ in group if p not in used]
    return Committed(position, chain, counts, stray)


def now() -> float:
    return time.time()


def iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
