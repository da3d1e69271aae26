"""bench/results.md is shared: each command that writes to it owns one section, between
`<!-- begin NAME -->` and `<!-- end NAME -->` lines, and replaces only that section (or
appends it), keeping everything else in the file as it was."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, text: str) -> None:
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + block + ("\n" + tail if tail else "")
    else:
        new = old.rstrip("\n") + ("\n\n" if old.strip() else "") + block
    path.write_text(new)
