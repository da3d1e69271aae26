"""tests/conftest.py's SLOW names files and directories by place: one that moves or is renamed
would silently join the quick loop (`make test-fast`) with all its processes, so every place it
names must exist."""

from __future__ import annotations

from tests.conftest import SLOW, TESTS


def test_every_place_the_slow_table_names_exists() -> None:
    missing = sorted(place for place in SLOW if not (TESTS / place).exists())
    assert not missing, f"tests/conftest.py SLOW names places that are gone (moved?): {missing}"
