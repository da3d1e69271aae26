"""What the gateway's image installs: the hashed locks Dockerfile.gateway installs from
(requirements-gateway.txt, requirements-jobs.txt), each distribution's pinned version, and the
closure of a set of requirements as installed here."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements-gateway.txt"


# The `jobs` extra: what the runtime lock does not already pin.
JOBS_LOCK = ROOT / "requirements-jobs.txt"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(path: Path = LOCK) -> list[list[str]]:
    """A lock's requirements, each as its words (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [line.split() for line in text.splitlines() if line.strip() and line[0] != "#"]


def lock(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for words in lock_entries(path):
        name, _, version = words[0].partition("==")
        pins[normalize(name)] = version
    return pins


def image_distributions() -> dict[str, str]:
    """Every distribution the image installs besides the gateway, with its version."""
    return {**lock(LOCK), **lock(JOBS_LOCK)}


def closure(requirements: list[str]) -> set[str]:
    """The requirements and theirs (with the extras they ask for), as installed here."""
    pending = [(Requirement(r), "") for r in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        key = (normalize(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        for needed in metadata.requires(requirement.name) or []:
            pending += [(Requirement(needed), e) for e in ("", *requirement.extras)]
    return {name for name, _ in seen}
