"""bench/results.md is shared: each command that writes to it owns one section, between
`<!-- begin NAME -->` and `<!-- end NAME -->` lines, and replaces only that section, keeping
everything else in the file as it was.

A new section goes right after the last marked one (so the marked sections stay together,
ahead of sections other commands find by their `## ` heading alone, which extend to the next
heading), or at the end of the file when there is none.

`spread` and `verdict` say how repeated runs and targets read in every section. Nothing but
these sections belongs in the file: hand-written readings of the results go to bench/notes.md,
and the docs quote only the sections (tests/test_docs.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.md"

# Each section of results.md and the command that writes it (tests/test_docs.py refuses a
# marked section that is not listed here, and the docs may quote only these).
SECTIONS = {
    "bench": "python -m bench",
    "realmodel": "python -m bench.realmodel",
    "profile": "python -m bench.profile",
    "peers": "python -m bench.peers",
    "batch-pixel": "python -m bench.batch --mode pixel",
    "batch-string": "python -m bench.batch --mode string",
    "http": "python -m bench.http",
    "jobs": "python -m bench.jobs",
    "zoo": "python -m tests.zoo.deviation",
    "fairness": "python -m bench.fairness",
    "batching": "python -m bench.batching",
    "rollout": "python -m bench.rollout",
    "hotpath": "python -m bench.hotpath",
    "suite": "python -m tests.support.suitetime",
    "suite-fast": "python -m tests.support.suitetime --fast",
    "cost": "python -m bench.cost",
    "pipelines": "python -m bench.pipelines",
}
_END = "<!-- end "


def write_section(path: Path, name: str, text: str) -> None:
    begin, end = f"<!-- begin {name} -->", f"{_END}{name} -->"
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + block + ("\n" + tail if tail else "")
    elif _END in old:
        cut = old.index("\n", old.rindex(_END)) + 1 if "\n" in old[old.rindex(_END) :] else len(old)
        head, tail = old[:cut], old[cut:].lstrip("\n")
        new = head.rstrip("\n") + "\n\n" + block + ("\n" + tail if tail else "")
    else:
        new = old.rstrip("\n") + ("\n\n" if old.strip() else "") + block
    path.write_text(new)


def read_section(path: Path, name: str) -> str:
    """The text of a section of `path` ("" when the file or the section is not there)."""
    begin, end = f"<!-- begin {name} -->", f"{_END}{name} -->"
    try:
        text = path.read_text()
    except OSError:
        return ""
    if begin not in text or end not in text:
        return ""
    return text.split(begin, 1)[1].split(end, 1)[0]


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """ "median (min to max)" of repeated runs; just the value for one run."""
    if len(values) == 1:
        return fmt.format(values[0])
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{fmt.format(mid)} ({fmt.format(low)} to {fmt.format(high)})"


def verdict(values: Sequence[float], ok: Callable[[float], bool]) -> str:
    """met when every run meets the target, not met when none does; otherwise says how many."""
    passed = sum(ok(v) for v in values)
    if passed == len(values):
        return "met" if len(values) == 1 else f"met in all {len(values)} runs"
    if passed == 0:
        return "**not met**" if len(values) == 1 else f"**not met** in any of {len(values)} runs"
    return f"**borderline**: met in {passed} of {len(values)} runs"
