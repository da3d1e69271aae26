"""`make test`'s two workers (tests/support/workers.py): a test directory is one unit of work,
so the servers its conftest.py starts for the session start once; the directories go out
longest first, by the per-directory seconds of the last measured whole run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench import results as bench_results
from tests.support import suitetime, workers

ROOT = Path(__file__).resolve().parents[1]


def test_a_test_belongs_to_its_files_directory() -> None:
    assert workers.group("tests/zoo/test_zoo.py::test_one[a/b]") == "tests/zoo"
    assert workers.group("tests/jobs/control/test_flow.py::TestX::test_y") == "tests/jobs/control"
    assert workers.group("test_top.py::test") == "."


def test_the_seconds_are_read_from_the_section_suitetime_writes(tmp_path: Path) -> None:
    cases = [
        suitetime.Case("tests/zoo/test_zoo.py", "a", 1200.5, "passed"),
        suitetime.Case("tests/zoo/test_mistakes.py", "b", 100.0, "passed"),
        suitetime.Case("tests/api/test_status.py", "c", 2.5, "passed"),
    ]
    results = tmp_path / "results.md"
    results.write_text(
        "<!-- begin other -->\n| `tests/api` | 9 | 99.0 | 1% |\n<!-- end other -->\n"
    )
    bench_results.write_section(results, "suite", "pytest: " + suitetime.tables(cases))
    assert workers.measured_seconds(results) == {"tests/zoo": 1300.5, "tests/api": 2.5}
    assert workers.measured_seconds(tmp_path / "missing.md") == {}


@dataclass
class _Item:
    nodeid: str


def test_the_longest_directories_go_first_and_unknown_ones_last_in_their_order() -> None:
    ids = ["a/t.py::1", "b/t.py::1", "b/u.py::2", "c/t.py::1", "d/t.py::1", "a/u.py::2"]
    items = [_Item(i) for i in ids]
    ordered = workers.longest_first(items, {"b": 10.0, "c": 300.0})  # type: ignore[arg-type]
    assert [i.nodeid for i in ordered] == [
        "c/t.py::1",
        "b/t.py::1",
        "b/u.py::2",
        "a/t.py::1",  # a and d are not in the table: collection order, a's tests together
        "a/u.py::2",
        "d/t.py::1",
    ]


CONFTEST = """
import os, pytest
pytest_plugins = ["tests.support.workers"]
"""
DIRECTORY_CONFTEST = """
import json, os, pytest
@pytest.fixture(scope="session")
def server():
    with open(os.environ["STARTS"], "a") as out:
        out.write(json.dumps(os.environ.get("PYTEST_XDIST_WORKER")) + "\\n")
"""
TEST = """
import json, os
def test_{n}(server):
    with open(os.environ["RAN"], "a") as out:
        out.write(json.dumps([os.environ["PYTEST_XDIST_WORKER"], __file__]) + "\\n")
"""


def test_each_directory_runs_on_one_worker_and_starts_its_servers_once(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for directory in ("alpha", "beta", "gamma"):
        (suite / directory).mkdir()
        (suite / directory / "__init__.py").write_text("")
        (suite / directory / "conftest.py").write_text(DIRECTORY_CONFTEST)
        for module in ("test_one.py", "test_two.py"):
            (suite / directory / module).write_text(TEST.format(n=1) + TEST.format(n=2))
    env = dict(os.environ, PYTHONPATH=str(ROOT), STARTS=str(tmp_path / "starts"))
    env["RAN"] = str(tmp_path / "ran")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-n",
        "2",
        "--dist",
        "loadscope",
        "-p",
        "no:cacheprovider",
    ]
    run = subprocess.run(
        [*argv, "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "12 passed" in run.stdout
    by_directory: dict[str, set[str]] = defaultdict(set)
    for line in (tmp_path / "ran").read_text().splitlines():
        worker, file = json.loads(line)
        by_directory[Path(file).parent.name].add(worker)
    assert {name: len(w) for name, w in by_directory.items()} == dict.fromkeys(
        ("alpha", "beta", "gamma"), 1
    )
    assert set().union(*by_directory.values()) == {"gw0", "gw1"}  # both workers had work
    # One session server per directory: each directory's fixture ran on one worker only.
    assert len((tmp_path / "starts").read_text().splitlines()) == 3
