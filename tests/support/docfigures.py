"""The measured figures the docs quote, each matched against the source its paragraph names.

A figure is what a measurement gives: a ratio (`1.05x`), a time in ms or µs, a rate
(`requests/s`), a range with a unit (`0.98 to 1.80 s`, `74-75 MB`), an approximate quantity
(`about 9 MiB`, `~600 MB`, `near 80 MiB`) or a count out of a total (`2 of 9,475`). In
docs/benchmarks.md every number with a unit counts, and so does every date (`2026-11-25 20:05`:
when the quoted run was made); so does every number with a unit in a block that names a
results section or the soak report itself (`took 1,502.9 s`). Settings and limits (`60 s`,
`32 MiB`), inline code and code blocks are not figures. A paragraph, list or table is read as
one text, so a figure split by a line break is still seen.

Every block that quotes a figure names its source in an HTML comment (invisible on the rendered
page) inside the block, or on a paragraph of its own, which holds for the blocks after it up to
the next heading; the figure must be in that source:

    <!-- source: bench/results.md#peers -->        a section a bench command writes
    <!-- source: bench/soak-report.json -->        the soak table `make soak`'s report renders
    <!-- source: gateway/memory.py -->             a constant of the code or the manifests

Only the sections between `<!-- begin NAME -->` and `<!-- end NAME -->` in bench/results.md
count, and only those bench.results.SECTIONS lists (each written by its command); hand-written
notes (bench/notes.md) are no source. A figure matches when the source holds the same number
(thousands separators and signs aside) with the same unit after it or in its table column's
header, a range when it holds the same two ends, a count when it holds the same "N of M"; in a
code or manifest file, the number itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from bench import results as bench_results
from tests.support import soaktable

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results.md"
SOAK_REPORT = ROOT / "bench" / "soak-report.json"

UNITS = r"x|ms|µs|s|MB|MiB|KB|KiB|GB|GiB|B|%|requests/s|req/s|images/s"
NUMBER = r"[+−-]?\d[\d,]*(?:\.\d+)?"
ABOUT = r"~|about |around |near |nearly |almost |roughly "
FIGURE = re.compile(
    rf"(?P<about>(?:{ABOUT})?)(?<![\w.+−-])(?P<low>{NUMBER})"
    rf"(?:\s?(?:{UNITS})?\s?(?:to|-|–)\s?(?P<high>{NUMBER}))?"
    rf"\s?(?P<unit>{UNITS})(?![\w/])"
)
# "2 of 9,475": a count out of a total (not "1 of the", not a date or a version).
COUNT = re.compile(r"(?<![\w.+−-])(?P<low>\d[\d,]*) of (?P<high>\d[\d,]*)(?![\w.,]\d)")
# When a run was made: "2026-11-25 20:05" (a date alone when no time follows).
DATE = re.compile(r"(?<![\w-])(?P<low>\d{4}-\d{2}-\d{2})(?: (?P<high>\d{2}:\d{2})(?!:))?")
# Always figures, wherever they appear.
MEASURED_UNITS = {"x", "ms", "µs", "requests/s", "req/s", "images/s"}
SAME_UNIT = {"req/s": "requests/s"}
MEASURED_SOURCES = ("bench/results.md#", "bench/soak-report.json")
SOURCE = re.compile(r"<!--\s*source:\s*(?P<names>.+?)\s*-->")


class Figure(NamedTuple):
    path: Path
    line: int
    text: str
    numbers: tuple[str, ...]
    unit: str  # "of" for a count, "date" for a date
    sources: tuple[str, ...]


def _plain(number: str) -> str:
    return number.lstrip("+−-").replace(",", "")


def blocks(path: Path) -> list[tuple[list[int], str, tuple[str, ...], bool]]:
    """Each paragraph, list or table outside code blocks as (line number of each character's
    line, its text with lines joined by spaces and inline code removed, the sources it names,
    whether it names them itself rather than holding an earlier paragraph's)."""
    found: list[tuple[list[int], str, tuple[str, ...], bool]] = []
    lines: list[tuple[int, str]] = []
    fenced = False
    held: tuple[str, ...] = ()  # from a source comment on a paragraph of its own

    def close() -> None:
        nonlocal held
        if lines:
            text, where = "", []
            for number, line in lines:
                piece = (" " if text else "") + line
                text += piece
                where += [number] * len(piece)
            names = tuple(n.strip() for m in SOURCE.finditer(text) for n in m["names"].split(","))
            if names and not SOURCE.sub("", text).strip():
                held = names
            else:
                found.append((where, SOURCE.sub(" ", text), names or held, bool(names)))
        lines.clear()

    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            close()
            fenced = not fenced
        elif fenced:
            continue
        elif not line.strip() or line.startswith("#"):
            close()
            if line.startswith("#"):
                held = ()
        else:
            lines.append((number, re.sub(r"`[^`]*`", "", line.strip())))
    close()
    return found


def figures(path: Path, every_number: bool = False) -> list[Figure]:
    found = []
    for where, text, sources, own in blocks(path):
        # A block that names a measured source itself (a results section, the soak report)
        # quotes it: every number with a unit in it is a figure from there.
        quoting = own and any(name.startswith(MEASURED_SOURCES) for name in sources)
        for match in FIGURE.finditer(text):
            unit = SAME_UNIT.get(match["unit"], match["unit"])
            is_range = match["high"] is not None
            measured = unit in MEASURED_UNITS or is_range or match["about"]
            if not (every_number or quoting or measured):
                continue
            if re.search(r"\sx$", match[0]):  # "3 x GATEWAY_MAX_PIXELS": a product
                continue
            numbers = tuple(_plain(n) for n in (match["low"], match["high"]) if n is not None)
            line = where[match.start("low")]
            found.append(Figure(path, line, match[0].strip(), numbers, unit, sources))
        for match in COUNT.finditer(text):
            numbers = (_plain(match["low"]), _plain(match["high"]))
            line = where[match.start()]
            found.append(Figure(path, line, match[0], numbers, "of", sources))
        for match in DATE.finditer(text) if every_number else ():
            numbers = tuple(n for n in (match["low"], match["high"]) if n is not None)
            found.append(Figure(path, where[match.start()], match[0], numbers, "date", sources))
    return found


def _normal(text: str) -> str:
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)
    return text.replace("req/s", "requests/s")


class Source(NamedTuple):
    text: str
    columns: frozenset[tuple[str, str]]
    code: bool  # a code or manifest file: the number alone matches


def generated_sections(text: str) -> dict[str, str]:
    """The marked sections of a results file that a bench command writes, by name."""
    found = {}
    for match in re.finditer(r"<!-- begin (\S+) -->\n(.*?)<!-- end \1 -->", text, re.S):
        if match[1] in bench_results.SECTIONS:
            found[match[1]] = match[2]
    return found


def load_sources(
    names: Iterable[str], results: Path = RESULTS, soak: Path = SOAK_REPORT, root: Path = ROOT
) -> dict[str, Source | str]:
    """Each named source's text, or why it cannot be read."""
    sections = generated_sections(results.read_text())
    out: dict[str, Source | str] = {}
    for name in set(names):
        file, _, key = name.partition("#")
        if file == "bench/results.md":
            if key not in sections:
                out[name] = f"no generated section {key!r} in bench/results.md"
                continue
            text = _normal(sections[key])
            out[name] = Source(text, frozenset(column_figures(text)), code=False)
        elif file == "bench/soak-report.json":
            text = _normal(soaktable.render(json.loads(soak.read_text())))
            out[name] = Source(text, frozenset(column_figures(text)), code=False)
        elif key or not (root / file).is_file():
            out[name] = f"{name} is not a file of the repository (or a results file's section)"
        else:
            out[name] = Source(_normal((root / file).read_text()), frozenset(), code=True)
    return out


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


def in_source(figure: Figure, source: Source) -> bool:
    number = r"[+−-]?{}(?![\d])"
    first = rf"(?<![\d.]){number.format(re.escape(figure.numbers[0]))}"
    if source.code:
        # A constant: each number as the code or manifest writes it.
        return all(
            re.search(rf"(?<![\w.]){re.escape(n)}(?!\w|\.\d)", source.text) for n in figure.numbers
        )
    if figure.unit == "date":
        return " ".join(figure.numbers) in source.text
    if figure.unit == "of":
        return (
            re.search(rf"{first} of {re.escape(figure.numbers[1])}(?!\d)", source.text) is not None
        )
    if len(figure.numbers) == 2:
        second = number.format(re.escape(figure.numbers[1]))
        pattern = rf"{first}\s?(?:{UNITS})?\s?(?:to|-|–)\s?{second}"
    elif (figure.numbers[0], figure.unit) in source.columns:
        return True
    else:
        # The unit may follow a bracketed spread: "+0.71 (+0.65 to +0.74) ms".
        pattern = rf"{first}(?:\s?\([^()|]*\))?\s?{re.escape(figure.unit)}(?![\w/])"
    return re.search(pattern, source.text) is not None


def unsourced(
    pages: Iterable[Path],
    every_number: Iterable[Path] = (),
    results: Path = RESULTS,
    soak: Path = SOAK_REPORT,
    root: Path = ROOT,
) -> list[str]:
    """One line per figure that its block's sources do not hold (or that names none)."""
    every = set(every_number)
    found = [f for page in pages for f in figures(page, page in every)]
    sources: Mapping[str, Source | str] = load_sources(
        {s for f in found for s in f.sources}, results, soak, root
    )
    problems = []
    for f in found:
        where = f"{_shown(f.path, root)}:{f.line}: {f.text}"
        if not f.sources:
            problems.append(f"{where}: names no source (<!-- source: ... -->)")
            continue
        readable = [s for s in (sources[n] for n in f.sources) if isinstance(s, Source)]
        broken = [s for s in (sources[n] for n in f.sources) if isinstance(s, str)]
        if broken:
            problems.append(f"{where}: {'; '.join(broken)}")
        elif not any(in_source(f, s) for s in readable):
            problems.append(f"{where}: not in {', '.join(f.sources)}")
    return problems


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
