"""The README, the guides in docs/ and the k8s READMEs: every measured figure they quote is in
the source its paragraph names (tests/support/docfigures.py: a section a bench command writes,
the soak report, a constant of the code), every relative link and every repository path they
name resolves, and the README stays a front page.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from bench import results as bench_results
from tests.support import docfigures, soaktable
from tests.support.docfigures import figures

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# The k8s READMEs, not those of the npm packages `make k8s-check` installs under k8s/validate.
K8S_READMES = sorted(
    p for p in (ROOT / "k8s").glob("**/README.md") if "node_modules" not in p.parts
)
PAGES = (README, *DOCS, *K8S_READMES)
# Every number with a unit counts as a figure here, not only the measurement-shaped ones.
ALL_FIGURES = (ROOT / "docs" / "benchmarks.md",)
RESULTS = ROOT / "bench" / "results.md"
SOAK_REPORT = ROOT / "bench" / "soak-report.json"
NOTES = ROOT / "bench" / "notes.md"
CODE_DIRS = ("gateway", "bench", "serving", "tests", "tools", "k8s", "proto")


def test_every_figure_the_docs_quote_is_in_the_source_its_paragraph_names() -> None:
    missing = docfigures.unsourced(PAGES, ALL_FIGURES)
    assert not missing, (
        "figures with no generated source (run the command that measures them so that its "
        "section of the results holds them and commit it, quote what the section says, or name "
        "the right source in the paragraph: <!-- source: bench/results.md#SECTION -->):\n"
        + "\n".join(missing)
    )


def test_every_marked_section_of_the_results_is_written_by_a_command() -> None:
    marked = re.findall(r"^<!-- begin (\S+) -->$", RESULTS.read_text(), re.M)
    assert len(marked) == len(set(marked))
    unknown = sorted(set(marked) - set(bench_results.SECTIONS))
    assert not unknown, f"sections no command writes (bench.results.SECTIONS): {unknown}"
    outside = re.sub(
        r"<!-- begin (\S+) -->\n.*?<!-- end \1 -->\n?", "", RESULTS.read_text(), flags=re.S
    )
    assert not outside.strip(), f"text outside the generated sections: {outside.strip()[:200]}"


def test_the_docs_pass_without_the_hand_written_notes(tmp_path: Path) -> None:
    results = tmp_path / "results.md"
    # The notes back in, marked as the sections are: still no source.
    notes = f"<!-- begin notes -->\n{NOTES.read_text()}<!-- end notes -->\n"
    results.write_text(RESULTS.read_text() + "\n" + notes)
    assert (
        docfigures.unsourced(PAGES, ALL_FIGURES, results=results)
        == docfigures.unsourced(PAGES, ALL_FIGURES)
        == []
    )


@pytest.mark.parametrize(
    ("figure", "section"),
    [
        ("84-101 µs", "bench"),  # by hand, bench.ownwork writes nothing
        ("1.50x", "bench"),  # a run of 2026-11-24, since overwritten
        ("+3.70 ms", "bench"),  # a note about an earlier allocator
        ("about 9 MiB", "bench"),
    ],
)
def test_a_figure_from_the_notes_fails(tmp_path: Path, figure: str, section: str) -> None:
    assert figure in NOTES.read_text()
    page = tmp_path / "page.md"
    page.write_text(
        f"<!-- source: bench/results.md#{section} -->\nThe gateway measured {figure} here.\n"
    )
    [problem] = docfigures.unsourced([page])
    assert f"{figure}: not in bench/results.md#{section}" in problem


def test_a_changed_generated_figure_fails_until_the_docs_follow(tmp_path: Path) -> None:
    results = tmp_path / "results.md"
    text = RESULTS.read_text()
    # `python -m bench`'s start to SERVING (its target and section 4), which the docs quote.
    bench = text.split("<!-- end bench -->")[0]
    assert bench.count("0.55 s") == 2
    results.write_text(text.replace(bench, bench.replace("0.55 s", "0.61 s")))
    problems = docfigures.unsourced(PAGES, ALL_FIGURES, results=results)
    assert problems and all("0.55 s" in p for p in problems)
    pages = []
    for page in PAGES:
        copy = tmp_path / page.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(page.read_text().replace("0.55 s", "0.61 s"))
        pages.append(copy)
    every = [tmp_path / p.relative_to(ROOT) for p in ALL_FIGURES]
    assert docfigures.unsourced(pages, every, results=results, root=ROOT) == []


def test_a_figure_is_matched_in_the_section_its_paragraph_names(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    # +1.23 ms is the HTTP door's added p50 (bench.http), in no section of `python -m bench`.
    text = "The HTTP door added\n+1.23 ms. <!-- source: bench/results.md#{} -->\n"
    page.write_text(text.format("bench"))
    [problem] = docfigures.unsourced([page])
    assert problem.endswith("page.md:2: +1.23 ms: not in bench/results.md#bench")
    page.write_text(text.format("http"))
    assert docfigures.unsourced([page]) == []
    # A source on a paragraph of its own holds for the blocks after it, up to the next heading.
    page.write_text(
        "<!-- source: bench/results.md#http -->\n\nIt added +1.23 ms.\n\n# Next\n\n+1.23 ms"
    )
    [problem] = docfigures.unsourced([page])
    assert problem.endswith("page.md:7: +1.23 ms: names no source (<!-- source: ... -->)")
    page.write_text("Start to ready took 1.45 s (about\n75 MB).\n")
    assert [p.split(": ", 1)[1] for p in docfigures.unsourced([page])] == [
        "about 75 MB: names no source (<!-- source: ... -->)"
    ]


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
        ("climbed to about\n155 MiB, near 80 MiB", [("155",), ("80",)]),
        ("2 of 9,475 health checks", [("2", "9475")]),
        ("a 60 s timeout, 32 MiB, 3 retries, 1 of the pods", []),
    ],
)
def test_measurements_are_told_from_settings(tmp_path: Path, text: str, expected: list) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"{text}\n\n```\n1.5x in a code block\n```\n`2.5x in inline code`\n")
    assert [f.numbers for f in figures(page)] == expected


def test_a_block_naming_a_measured_source_itself_quotes_every_number_with_a_unit(
    tmp_path: Path,
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- source: bench/results.md#suite -->\n`make test` took 1,502.9 s.\n\n"
        "A 60 s timeout.\n\n<!-- source: bench/soak-report.json -->\n\nA 32 MiB limit.\n"
    )
    # The settings after it, and those under a source held from a paragraph of its own, are not.
    assert [f.numbers for f in figures(page)] == [("1502.9",)]


def _source(text: str) -> docfigures.Source:
    text = docfigures._normal(text)
    return docfigures.Source(text, frozenset(docfigures.column_figures(text)), code=False)


def _figure(tmp_path: Path, text: str) -> docfigures.Figure:
    page = tmp_path / "page.md"
    page.write_text(text + "\n")
    [found] = figures(page, every_number=True)
    return found


def test_a_range_matches_only_the_same_two_ends(tmp_path: Path) -> None:
    source = _source("| 1.05x (1.03x to 1.10x) | HTTP 1.28 ms, gRPC 1.19 ms (1.08x) | 75 MB |")
    assert not docfigures.in_source(_figure(tmp_path, "1.03x-1.08x"), source)
    assert docfigures.in_source(_figure(tmp_path, "1.03x to 1.10x"), source)
    assert docfigures.in_source(_figure(tmp_path, "1.28 ms"), source)
    assert not docfigures.in_source(_figure(tmp_path, "75 MiB"), source)


def test_a_number_under_a_header_with_the_unit_matches(tmp_path: Path) -> None:
    source = _source("| door | requests/s | p50 |\n|---|---|---|\n| gRPC | 782 | 40.40 ms |\n")
    assert docfigures.in_source(_figure(tmp_path, "782 requests/s"), source)
    assert not docfigures.in_source(_figure(tmp_path, "782 ms"), source)


def test_a_count_matches_only_the_same_count_of_the_same_total(tmp_path: Path) -> None:
    source = _source("9,409 checks: 495 CANCELLED; met in 1 of 3 runs")
    assert docfigures.in_source(_figure(tmp_path, "1 of 3"), source)
    assert not docfigures.in_source(_figure(tmp_path, "2 of 3"), source)


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) outside code blocks, with inline code removed."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, re.sub(r"`[^`]*`", "", line)))
    return lines


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
    for page in PAGES:
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
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for path in REPO_PATH.findall(line)
        if not (ROOT / path).exists()
    ]
    assert not stale, "paths that no longer exist (moved or renamed?):\n" + "\n".join(stale)


def test_every_repository_path_the_code_names_exists() -> None:
    """Comments and docstrings cite files by their path: each is in the repository (relative
    to the root or to the citing file's directory), unless it is another project's
    ("MLServer's tests/grpc/conftest.py") or one the build makes and .gitignore names
    (k8s/validate/node_modules, there only once `make k8s-check` has run)."""
    stale = []
    modules = (p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py"))
    for module in sorted(p for p in modules if "node_modules" not in p.parts):
        for number, line in enumerate(module.read_text().splitlines(), 1):
            for match in REPO_PATH.finditer(line):
                path = match[1]
                if line[: match.start()].endswith("'s ") or "..." in path:
                    continue
                if not ((ROOT / path).exists() or (module.parent / path).exists()):
                    stale.append(f"{module.relative_to(ROOT)}:{number}: {path}")
    built = _ignored(entry.rsplit(": ", 1)[1] for entry in stale)
    stale = [entry for entry in stale if entry.rsplit(": ", 1)[1] not in built]
    assert not stale, "paths that no longer exist (moved or renamed?):\n" + "\n".join(stale)


def _ignored(paths: Iterable[str]) -> set[str]:
    """Of `paths` (relative to the root), those .gitignore names: made by the build. Each is
    asked as a file and as a directory (a missing path's kind is unknown, and a pattern ending
    in / names directories only)."""
    listed = "\n".join(f"{path}\n{path}/" for path in paths)
    if not listed:
        return set()
    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
        input=listed, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr  # 1: none of them is ignored
    return {line.rstrip("/") for line in done.stdout.split()}


def test_every_markdown_file_a_comment_cites_is_in_the_repository() -> None:
    """A comment that cites a guide or a notes file by name ("tfserving.md §1") cites one a
    reader of the repository can open."""
    guides = {p.name for p in ROOT.rglob("*.md") if "node_modules" not in p.parts}
    modules = (p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py"))
    missing = [
        f"{module.relative_to(ROOT)}:{number}: {name}"
        for module in sorted(p for p in modules if "node_modules" not in p.parts)
        for number, line in enumerate(module.read_text().splitlines(), 1)
        if "#" in line
        for name in re.findall(r"([\w.-]+\.md)\b", line[line.index("#") :])
        if name not in guides
    ]
    assert not missing, "comments citing files outside the repository:\n" + "\n".join(missing)


def test_every_test_directory_is_in_the_testing_guide_and_the_readme_layout() -> None:
    directories = sorted(
        p.parent.name for p in (ROOT / "tests").glob("*/__init__.py") if p.parent.name != "support"
    )
    guide = (ROOT / "docs" / "testing.md").read_text()
    layout = README.read_text().split("\ntests/ ", 1)[1].split("```", 1)[0]
    missing = [d for d in directories if f"tests/{d}" not in guide]
    missing += [f"README: {d}" for d in directories if not re.search(rf"\b{d}/", layout)]
    assert not missing, f"test directories the docs do not describe: {missing}"


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
