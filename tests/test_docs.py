"""The README and the guides in docs/: every measured figure they quote is in a committed
results file (bench/results.md, or the soak table rendered from bench/soak-report.json), every
relative link and every repository path they name resolves, and the README stays a front page.

A figure is what a measurement gives: a ratio (`1.05x`), a time in ms or µs, a rate
(`requests/s`), a range with a unit (`0.98 to 1.80 s`, `74-75 MB`) or an approximate quantity
(`about 9 MiB`, `~600 MB`). In docs/benchmarks.md every number with a unit counts. Settings and
limits (`60 s`, `32 MiB`), inline code and code blocks are not figures. A figure matches when the
results hold the same number (thousands separators and signs aside) with the same unit after it
or in its table column's header, a range when they hold the same two ends.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.support import soaktable

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Every number with a unit counts as a figure here, not only the measurement-shaped ones.
ALL_FIGURES = {ROOT / "docs" / "benchmarks.md"}
RESULTS = ROOT / "bench" / "results.md"
SOAK_REPORT = ROOT / "bench" / "soak-report.json"

UNITS = r"x|ms|µs|s|MB|MiB|KB|KiB|GB|GiB|B|%|requests/s|req/s|images/s"
NUMBER = r"[+−-]?\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?P<about>(?:~|about |around )?)(?<![\w.+−-])(?P<low>{NUMBER})"
    rf"(?:\s?(?:{UNITS})?\s?(?:to|-|–)\s?(?P<high>{NUMBER}))?"
    rf"\s?(?P<unit>{UNITS})(?![\w/])"
)
# Always figures, wherever they appear.
MEASURED_UNITS = {"x", "ms", "µs", "requests/s", "req/s", "images/s"}
SAME_UNIT = {"req/s": "requests/s"}


class Figure(NamedTuple):
    path: Path
    line: int
    text: str
    numbers: tuple[str, ...]
    unit: str


def _plain(number: str) -> str:
    return number.lstrip("+−-").replace(",", "")


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) outside code blocks, with inline code removed."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, re.sub(r"`[^`]*`", "", line)))
    return lines


def figures(path: Path) -> list[Figure]:
    found = []
    for number, line in prose(path):
        for match in FIGURE.finditer(line):
            unit = SAME_UNIT.get(match["unit"], match["unit"])
            is_range = match["high"] is not None
            if not (path in ALL_FIGURES or unit in MEASURED_UNITS or is_range or match["about"]):
                continue
            numbers = tuple(_plain(n) for n in (match["low"], match["high"]) if n is not None)
            found.append(Figure(path, number, match[0].strip(), numbers, unit))
    return found


def results_text() -> str:
    """What the committed results say: bench/results.md and the soak table of the report."""
    soak = soaktable.render(json.loads(SOAK_REPORT.read_text()))
    text = RESULTS.read_text() + "\n" + soak
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)
    return text.replace("req/s", "requests/s")


def column_figures(text: str) -> set[tuple[str, str]]:
    """(number, unit) for the numbers in table cells whose column header names the unit
    ("| requests/s |" over "| 766 |")."""
    found: set[tuple[str, str]] = set()
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = cells
            continue
        for title, cell in zip(header, cells, strict=False):
            units = [
                u for u in UNITS.split("|") if re.search(rf"(?<![\w/]){re.escape(u)}\b", title)
            ]
            for unit in units:
                for number in re.findall(NUMBER, cell):
                    found.add((_plain(number), SAME_UNIT.get(unit, unit)))
    return found


def in_results(figure: Figure, text: str, columns: set[tuple[str, str]] = frozenset()) -> bool:
    number = r"[+−-]?{}(?![\d])"
    first = rf"(?<![\d.]){number.format(re.escape(figure.numbers[0]))}"
    if len(figure.numbers) == 2:
        second = number.format(re.escape(figure.numbers[1]))
        pattern = rf"{first}\s?(?:{UNITS})?\s?(?:to|-|–)\s?{second}"
    elif (figure.numbers[0], figure.unit) in columns:
        return True
    else:
        # The unit may follow a bracketed spread: "+0.71 (+0.65 to +0.74) ms".
        pattern = rf"{first}(?:\s?\([^()|]*\))?\s?{re.escape(figure.unit)}(?![\w/])"
    return re.search(pattern, text) is not None


def test_every_figure_the_docs_quote_is_in_a_committed_results_file() -> None:
    text = results_text()
    columns = column_figures(text)
    missing = [
        f"{f.path.relative_to(ROOT)}:{f.line}: {f.text}"
        for path in (README, *DOCS)
        for f in figures(path)
        if not in_results(f, text, columns)
    ]
    assert not missing, (
        "figures with no committed source (run the command that measures them so that its "
        "results file holds them, and commit it; or quote what the results file says):\n"
        + "\n".join(missing)
    )


def test_the_soak_table_in_the_docs_is_the_committed_report_rendered() -> None:
    table = soaktable.render(json.loads(SOAK_REPORT.read_text()))
    assert table in (ROOT / "docs" / "operations.md").read_text()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.05x (1.03x to 1.08x)", [("1.05",), ("1.03", "1.08")]),
        ("0.98 to 1.80 s", [("0.98", "1.80")]),
        ("74-75 MB", [("74", "75")]),
        ("1,200-2,300 requests/s", [("1200", "2300")]),
        ("60-100 µs per request", [("60", "100")]),
        ("+0.71 ms", [("0.71",)]),
        ("about 9 MiB", [("9",)]),
        ("a 60 s timeout, 32 MiB, 3 retries", []),
    ],
)
def test_measurements_are_told_from_settings(tmp_path: Path, text: str, expected: list) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"{text}\n\n```\n1.5x in a code block\n```\n`2.5x in inline code`\n")
    assert [f.numbers for f in figures(page)] == expected


def test_a_range_matches_only_the_same_two_ends() -> None:
    text = "| 1.05x (1.03x to 1.10x) | HTTP 1.28 ms, gRPC 1.19 ms (1.08x) | 75 MB |"
    [quoted] = figures_of("1.03x-1.08x")
    assert not in_results(quoted, text)
    [quoted] = figures_of("1.03x to 1.10x")
    assert in_results(quoted, text)
    [quoted] = figures_of("1.28 ms")
    assert in_results(quoted, text)
    [quoted] = figures_of("75 MiB")
    assert not in_results(quoted, text)


def test_a_number_under_a_header_with_the_unit_matches() -> None:
    table = "| door | requests/s | p50 |\n|---|---|---|\n| gRPC | 782 | 40.40 ms |\n"
    columns = column_figures(table)
    [quoted] = figures_of("782 requests/s")
    assert in_results(quoted, table, columns)
    [quoted] = figures_of("782 ms")
    assert not in_results(quoted, table, columns)


def figures_of(text: str) -> list[Figure]:
    numbers = []
    for match in FIGURE.finditer(text):
        unit = SAME_UNIT.get(match["unit"], match["unit"])
        ends = tuple(_plain(n) for n in (match["low"], match["high"]) if n is not None)
        numbers.append(Figure(Path("-"), 1, match[0], ends, unit))
    return numbers


LINK = re.compile(r"\]\((?!https?:|mailto:)([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    found = set()
    for _, line in prose(path):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in (README, *DOCS):
        for number, line in prose(page):
            for target in LINK.findall(line):
                file, _, anchor = target.partition("#")
                resolved = (page.parent / file).resolve() if file else page
                if not resolved.exists():
                    broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such file)")
                elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# A path in the repository, as the docs name files and directories (not inside a longer path,
# not a glob).
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:gateway|tests|serving|bench|k8s|proto|tools|docs)/[\w./-]*\w)(?![\w*])"
)


def test_every_repository_path_the_docs_name_exists() -> None:
    stale = [
        f"{page.relative_to(ROOT)}:{number}: {path}"
        for page in (README, *DOCS)
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for path in REPO_PATH.findall(line)
        if not (ROOT / path).exists()
    ]
    assert not stale, "paths that no longer exist (moved or renamed?):\n" + "\n".join(stale)


def test_every_guide_is_linked_from_the_readme() -> None:
    linked = set(LINK.findall(README.read_text()))
    unlinked = [f"docs/{page.name}" for page in DOCS if f"docs/{page.name}" not in linked]
    assert not unlinked, f"add these guides to README.md's Documentation table: {unlinked}"


def test_the_readme_is_a_front_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 350, "README.md is the front page: move detail to docs/"
    for command in ("make run", "make test"):
        assert command in text
    assert "serving/local/" in text and "not the production" in text
