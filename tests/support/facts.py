"""TF Serving's texts and codes as recorded in serving/local/FACTS.md, for tests to compare with.

The facts are read from the file's tables (id, code, text, source), so a test asserts what
TF Serving does, written down with its source, and not what the local server's code says.

    fact("servable_not_found_specific", model="detector", version=7)
    -> ("NOT_FOUND", "Servable not found for request: Specific(detector, 7)")
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FACTS_PATH = Path(__file__).resolve().parents[2] / "serving" / "local" / "FACTS.md"
_ROW = re.compile(
    r"^\| `(?P<id>[a-z0-9_]+)` \| (?P<code>[^|]+) \| `(?P<text>.*)` \| (?P<source>.+) \|$"
)
_PLACEHOLDER = re.compile(r"<([a-z][a-z ]*)>")


@dataclass(frozen=True)
class Fact:
    code: str
    text: str
    source: str


@cache
def facts() -> dict[str, Fact]:
    """Every fact of FACTS.md by id."""
    result = {}
    for line in FACTS_PATH.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            assert match["id"] not in result, f"duplicate fact {match['id']}"
            result[match["id"]] = Fact(
                match["code"].strip(), match["text"], match["source"].strip()
            )
    return result


def text(fact_id: str, **values: object) -> str:
    """The fact's text with its <placeholders> filled in (names with '_' for spaces)."""
    template = facts()[fact_id].text
    names = set(_PLACEHOLDER.findall(template))
    given = {name.replace("_", " "): value for name, value in values.items()}
    assert names == set(given), f"{fact_id} needs {sorted(names)}, got {sorted(given)}"
    return _PLACEHOLDER.sub(lambda m: str(given[m.group(1)]), template)


def fact(fact_id: str, **values: object) -> tuple[str, str]:
    """(gRPC code name, message) of an error fact."""
    return facts()[fact_id].code, text(fact_id, **values)
