"""Both doors in the test process over one pipeline (tests/support/doors.py), serving the two
models of tests/support/doormodels.py: `detector` (one box over the centre half of the image)
and `colours` (a classifier of the image's mean colour)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.doormodels import models, write_model_config
from tests.support.doors import InProcessDoors


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDoors]:
    config = write_model_config(tmp_path_factory.mktemp("doors"))
    with InProcessDoors(models(), model_config=str(config), max_pixels=1_000_000) as running:
        yield running
