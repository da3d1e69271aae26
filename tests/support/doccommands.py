"""The commands of README.md and docs/*.md, as a user pastes them (tests/docs/).

Every fenced block in a command language (`sh`, `python`, ...) is a command block. By default it
runs against the session's `make run` (tests/support/makerun.py), byte for byte as printed apart
from the substitutions of `SUBSTITUTIONS` (ports, the dataset directory) and of `PLACEHOLDERS`
(an operation's or upload's name taken from an earlier answer of the same block), in a
directory that holds the files the docs name (`FILES`: street.jpg, cat.png, ...) and links to
the repository's `.venv`, `serving` and `make run`'s `models`.

A block that cannot run against `make run` says how it is checked instead, in an HTML comment
on the line before its fence:

    <!-- command: envtest -->

`KINDS` lists them. An unmarked block that does not run fails its test with its file:line; so
does an unlabelled fence whose first line is a command (label it `sh`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

SHELL = frozenset({"sh", "bash", "shell", "console"})
PYTHON = frozenset({"python", "py"})
COMMAND_LANGUAGES = SHELL | PYTHON

# How a block is checked, by the word of its marker (none: "run").
KINDS = {
    "run": "run against the session's `make run` (tests/docs/test_commands_run.py)",
    "envtest": "kubectl on envtest's API server, what changes a cluster as --dry-run=server "
    "(tests/k8s/test_doc_commands.py)",
    "moto": "against an S3 server on loopback (moto) whose bucket holds the dataset "
    "(tests/docs/test_commands_elsewhere.py)",
    "server": "a server: started as printed, checked once it serves, stopped "
    "(tests/docs/test_commands_elsewhere.py)",
    "synopsis": "a usage synopsis: every flag and choice it names is in the --help of the "
    "commands the marker names (tests/docs/test_command_blocks.py)",
    "excerpt": "code quoted from the file the marker names: its lines are there, in order "
    "(tests/docs/test_command_blocks.py)",
    "make": "make targets: `make -n TARGET` resolves each; `make run` itself is the make_run "
    "fixture (tests/docs/test_command_blocks.py)",
}

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!-- command: (?P<kind>[a-z]+)(?: (?P<arg>.*?))? -->\s*$")
# An unlabelled fence starting like one of these is a command block with no language.
_COMMAND_WORDS = re.compile(
    r"^\s*(\$ )?(python3?|\.venv/bin/\S+|curl|grpcurl|make|kubectl|detection-batch|vision-\w+|"
    r"jq|pip|docker|helm|for|export)\b"
)


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: where it starts (the fence's line, 1-based), its language,
    its text (the fence's indentation removed) and the marker before it."""

    page: Path
    line: int
    lang: str
    text: str
    kind: str
    arg: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"

    def __str__(self) -> str:
        return self.where

    @property
    def is_command(self) -> bool:
        return self.lang in COMMAND_LANGUAGES


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, with the marker on the nearest non-blank line above it."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent = len(fence["indent"])
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = "\n".join(line[indent:] for line in lines[i + 1 : end])
        above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = _MARKER.match(above)
        found.append(
            Block(
                page,
                i + 1,
                fence["lang"],
                body + "\n",
                marker["kind"] if marker else "run",
                (marker["arg"] or "") if marker else "",
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def command_blocks(kind: str | None = None) -> list[Block]:
    """The command blocks of every page, those of one kind when given."""
    return [b for b in all_blocks() if b.is_command and (kind is None or b.kind == kind)]


def unlabelled_commands() -> list[Block]:
    """Fences without a language whose first line is a command."""
    return [
        b
        for b in all_blocks()
        if not b.lang and b.text.strip() and _COMMAND_WORDS.match(b.text.splitlines()[0])
    ]


def stray_markers() -> list[str]:
    """Markers not followed by a command block (a typo in a marker would leave its block
    unmarked, which the run then reports; a marker above nothing is reported here)."""
    stray = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        starts = {b.line for b in page_blocks(page) if b.is_command}
        for n, line in enumerate(lines, 1):
            marker = _MARKER.match(line)
            if not marker:
                continue
            following = next(
                (k for k in range(n + 1, len(lines) + 1) if lines[k - 1].strip()), None
            )
            where = f"{page.relative_to(ROOT).as_posix()}:{n}"
            if following not in starts:
                stray.append(f"{where}: no command block follows the marker")
            elif marker["kind"] not in KINDS:
                stray.append(f"{where}: unknown kind {marker['kind']!r} (one of {list(KINDS)})")
    return stray


@dataclass(frozen=True)
class Command:
    """One shell command of a block: its text (continuation lines kept), the line it starts
    on, and the answer the doc shows for it (a comment after it that starts with { or [)."""

    text: str
    line: int
    shown: str


def shell_commands(block: Block) -> list[Command]:
    """A shell block split into commands: lines joined while a line ends with a backslash or a
    quote is open; comment lines after a command that show an answer are kept with it."""
    lines = block.text.splitlines()
    commands: list[Command] = []
    pending: list[str] = []
    start = 0
    shown: list[str] = []

    def close() -> None:
        if commands and shown:
            last = commands[-1]
            commands[-1] = Command(last.text, last.line, " ".join(shown))
        shown.clear()

    for n, line in enumerate(lines):
        if not pending:
            stripped = line.strip()
            if not stripped:
                close()
                continue
            if stripped.startswith("#"):
                comment = stripped.lstrip("#").strip()
                if shown or (commands and comment[:1] in "{[" and comment):
                    shown.append(comment)
                else:
                    close()
                continue
            close()
            start = n
        pending.append(line)
        text = "\n".join(pending)
        if line.endswith("\\") or not _complete(text):
            continue
        command, inline = _split_comment(text)
        commands.append(Command(command, block.line + 1 + start, ""))
        if inline[:1] in ("{", "["):
            shown.append(inline)
        pending = []
    if pending:
        raise ValueError(f"{block.where}: the block ends inside a command: {pending[0]!r}")
    close()
    return commands


def _complete(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def _split_comment(text: str) -> tuple[str, str]:
    """The command and its trailing comment (a # outside quotes, after a blank)."""
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 2
            continue
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip(), text[i + 1 :].strip()
        i += 1
    return text, ""


_TOKENS = re.compile(r"\w+|[^\s\w]")


def _code_tokens(line: str) -> list[str]:
    """A line's tokens without its comment (a # outside quotes)."""
    return _TOKENS.findall(_split_comment(line)[0] if "#" in line else line)


def excerpt_misses(block: Block) -> list[str]:
    """The lines of an excerpt block that are not in the file its marker names, in order. A
    line matches a line of the file whose tokens hold its tokens in order (comments aside, so
    a doc may add its own and leave out annotations); `...` and blank lines stand for what
    the excerpt leaves out."""
    source = ROOT / block.arg
    if not block.arg or not source.is_file():
        return [f"{block.where}: the marker names no file of the repository ({block.arg!r})"]
    lines = [_code_tokens(line) for line in source.read_text().splitlines()]
    misses = []
    at = 0
    for n, line in enumerate(block.text.splitlines(), block.line + 1):
        wanted = _code_tokens(line)
        if not wanted or wanted == [".", ".", "."]:
            continue
        found = next((k for k in range(at, len(lines)) if _holds(lines[k], wanted)), None)
        if found is None:
            misses.append(
                f"{block.page.name}:{n}: not in {block.arg} (after its line {at}): {line.strip()}"
            )
        else:
            at = found + 1
    return misses


def _holds(tokens: list[str], wanted: list[str]) -> bool:
    rest = iter(tokens)
    return bool(tokens) and all(any(t == w for t in rest) for w in wanted)


def synopsis_commands(block: Block) -> list[str]:
    """A synopsis's commands: a line that does not start with a blank starts one."""
    commands: list[str] = []
    for line in block.text.splitlines():
        if line.strip() and not line[:1].isspace():
            commands.append(line.strip())
        elif line.strip() and commands:
            commands[-1] += " " + line.strip()
    return commands


def synopsis_misses(block: Block, help_text: str) -> list[str]:
    """Flags and choices a synopsis names that the program's --help does not: every `--flag`
    is in the help, and so is every choice of `--flag a|b|c`."""
    misses = []
    for command in synopsis_commands(block):
        for flag, choices in re.findall(
            r"(--[a-z][a-z0-9-]*)(?: ([a-z][a-z-]*(?:\|[a-z-]+)+))?", command
        ):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text):
                misses.append(f"{block.where}: {flag} is not in the program's --help")
            offered = re.search(rf"{re.escape(flag)} \{{([^}}]*)\}}", help_text)
            for choice in choices.split("|") if choices else ():
                if not offered or choice not in offered[1].split(","):
                    misses.append(f"{block.where}: {flag} {choice} is not a choice of --help")
    return misses


# An output sample the doc shows for the command block just above it (a fence of its own,
# after this marker): each of its lines starts as a line of the real output does.
ANSWER_MARKER = "<!-- answer of the block above -->"


def answer_sample(block: Block) -> Block | None:
    """The output sample marked as the answer of `block`: the page's next fenced block, with
    ANSWER_MARKER on the line before it."""
    blocks = page_blocks(block.page)
    following = [b for b in blocks if b.line > block.line]
    if not following:
        return None
    lines = block.page.read_text().splitlines()
    above = next((lines[k] for k in range(following[0].line - 2, -1, -1) if lines[k].strip()), "")
    return following[0] if above.strip() == ANSWER_MARKER else None


def answer_misses(sample: Block, output: str) -> list[str]:
    """The lines of an output sample whose head (the words it starts with, before a name,
    number or value) starts no line of the real output: a renamed or vanished section."""
    heads = {line.strip() for line in output.splitlines() if line.strip()}
    misses = []
    for n, line in enumerate(sample.text.splitlines(), sample.line + 1):
        head = _head(line)
        if head and not any(h.startswith(head) for h in heads):
            misses.append(f"{sample.page.name}:{n}: no line of the output starts {head!r}")
    return misses


def _head(line: str) -> str:
    """The plain words a line starts with, up to a label's colon (`input plan:`), before a
    name, a number or a quote (`model 'x'` -> `model`)."""
    words: list[str] = []
    for word in line.strip().split(" "):
        if not re.fullmatch(r"[A-Za-z]+:?", word):
            break
        words.append(word)
        if word.endswith(":"):
            break
    return " ".join(words)
