"""The attack table in docs/security.md cannot go stale: every test it names exists (its file,
and a test function of that name in it), every row names at least one, and every test of
this suite (tests/security/) is named in a row, so an attack tested here is also told there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
SECTION = "## Attacks and limits"
# A test as the table names it: path::function, optionally with a parametrize id.
TEST = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)(?:\[[^\]`]*\])?`")


def attack_rows(text: str) -> list[list[str]]:
    """The cells of every row of the section's tables whose header starts with 'Attack'."""
    section = text.split(SECTION, 1)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.MULTILINE)[0]
    rows, header = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif header[0] == "Attack" and not set(line) <= set("|-: "):
            rows.append(cells)
    return rows


def defined_tests(path: Path) -> set[str]:
    """Names of the test functions a module defines (module level or in a class)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def named_tests() -> set[tuple[str, str]]:
    return {
        (path, name)
        for cells in attack_rows(DOC.read_text(encoding="utf-8"))
        for path, name in TEST.findall(cells[-1])
    }


def test_every_row_tells_attack_outcome_and_the_tests_that_prove_it() -> None:
    rows = attack_rows(DOC.read_text(encoding="utf-8"))
    assert len(rows) >= 30, "the attack table went missing from docs/security.md"
    bad = [cells[0] for cells in rows if len(cells) != 3 or not TEST.search(cells[2])]
    assert not bad, f"rows without attack | outcome | `tests/...py::test_...`: {bad}"


def test_every_test_the_table_names_exists() -> None:
    missing = []
    defined: dict[str, set[str]] = {}
    for path, name in sorted(named_tests()):
        if not (ROOT / path).is_file():
            missing.append(f"{path} (no such file)")
            continue
        if path not in defined:
            defined[path] = defined_tests(ROOT / path)
        if name not in defined[path]:
            missing.append(f"{path}::{name}")
    assert not missing, "docs/security.md names tests that do not exist:\n" + "\n".join(missing)


def test_every_test_of_the_security_suite_is_in_the_table() -> None:
    named = named_tests()
    suite = ROOT / "tests" / "security"
    untold = [
        f"{path.relative_to(ROOT)}::{name}"
        for path in sorted(suite.glob("test_*.py"))
        if path.name != Path(__file__).name
        for name in sorted(defined_tests(path))
        if (str(path.relative_to(ROOT)), name) not in named
    ]
    assert not untold, "add these to the attack table in docs/security.md:\n" + "\n".join(untold)


def test_the_checks_see_a_stale_name(tmp_path: Path) -> None:
    text = (
        f"{SECTION}\n\n| Attack | Outcome | Proved by |\n|---|---|---|\n"
        "| a | b | `tests/security/test_attack_table.py::test_gone`, "
        "`tests/security/test_grpc_limits.py::test_calls_still_open_after_the_grace_are_cut"
        "[x]` |\n\n| Flag | Default | Meaning |\n|---|---|---|\n| `--x` | 1 | not a row |\n"
    )
    rows = attack_rows(text)
    assert len(rows) == 1
    names = TEST.findall(rows[0][-1])
    assert names == [
        ("tests/security/test_attack_table.py", "test_gone"),
        ("tests/security/test_grpc_limits.py", "test_calls_still_open_after_the_grace_are_cut"),
    ]
    here = defined_tests(Path(__file__))
    assert "test_gone" not in here and "test_the_checks_see_a_stale_name" in here
