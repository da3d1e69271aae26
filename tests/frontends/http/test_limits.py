"""The shared pieces of the HTTP door's body limits (gateway.frontends.http.limits). Each
reader has its own tests: test_json_body.py, test_msgpack_body.py, test_form_body.py."""

from __future__ import annotations

import pytest

from gateway.frontends.http import limits


def test_windowed_searches_see_what_one_search_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "WINDOW", 8)
    for size in range(30):
        for needle in (b"ab", b"abcde", b"a"):
            data = b"x" * size + needle + b"y" * 5
            assert limits.find(data, needle) == data.find(needle) == size
            assert limits.find(data, needle, 1, size + len(needle) - 1) == -1
