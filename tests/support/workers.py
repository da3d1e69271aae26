"""A pytest plugin (tests/conftest.py loads it): how `make test` shares its tests between
pytest-xdist's workers (`pytest -n 2`).

A test directory is one unit of work: every file of it runs on the same worker, so the servers
its conftest.py starts once for the session (the zoo's TF Serving with eighteen models, the
HTTP door's gateway, envtest's API server) start once, not once per worker. The directories go
out longest first, by the seconds each took in the last measured whole run
(bench/results.md#suite, written by `python -m tests.support.suitetime`), so the long ones do
not start last and leave one worker alone at the end; a directory the table does not know goes
after the known ones, in collection order. Without `-n` none of this applies: the order is
pytest's own.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from bench import results as bench_results

# A row of the section's per-directory table: | `tests/zoo` | 40 | 1,234.5 | 9.9% |
ROW = re.compile(r"^\| `(?P<directory>[^`]+)` \| \d[\d,]* \| (?P<seconds>[\d,.]+) \|", re.M)


def group(nodeid: str) -> str:
    """The unit of work a test belongs to: its file's directory (tests/jobs/control)."""
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


def measured_seconds(results: Path = bench_results.RESULTS) -> dict[str, float]:
    """Seconds per test directory in the last measured whole run; empty when there is none."""
    section = bench_results.read_section(results, "suite")
    return {m["directory"]: float(m["seconds"].replace(",", "")) for m in ROW.finditer(section)}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """The items by their directory's measured seconds, longest first; stable within a
    directory and among directories the table does not know (which go last)."""
    rank = {name: -seconds.get(name, -1.0) for name in {group(item.nodeid) for item in items}}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(group(item.nodeid), index)
    return sorted(items, key=lambda i: (rank[group(i.nodeid)], first_seen[group(i.nodeid)]))


class DirectoryScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a directory as the scope, in the order the workers
    collected (longest_first), not xdist's own by number of tests."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return group(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> DirectoryScheduling:
    return DirectoryScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Only on an xdist worker: every worker sorts the same collection the same way, as the
    # controller requires, and a run without -n keeps pytest's order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = longest_first(items, measured_seconds())
