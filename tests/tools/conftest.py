"""The launcher's tests share the session's `make run` (tests/support/makerun.py) and a
channel to its gateway."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.support.browser import browser  # noqa: F401
from tests.support.gatewayproc import CHANNEL_OPTIONS
from tests.support.makerun import MakeRun


@pytest.fixture(scope="module")
def channel(make_run: MakeRun) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(make_run.target, options=CHANNEL_OPTIONS) as channel:
        yield channel
