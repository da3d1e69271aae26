"""bench/results.md is shared: each command that writes to it owns one section, between
`<!-- begin NAME -->` and `<!-- end NAME -->` lines, and replaces only that section, keeping
everything else in the file as it was.

A new section goes right after the last marked one (so the marked sections stay together,
ahead of sections other commands find by their `## ` heading alone, which extend to the next
heading), or at the end of the file when there is none.
"""

from __future__ import annotations

from pathlib import Path

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
