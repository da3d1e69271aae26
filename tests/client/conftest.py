"""The client against both doors in the test process (tests/support/doors.py) serving the
detector and classifier of tests/support/doormodels.py, and its pipelines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.doormodels import PIPELINES, models, write_model_config
from tests.support.doors import InProcessDoors


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDoors]:
    config = write_model_config(tmp_path_factory.mktemp("client"), PIPELINES)
    with InProcessDoors(models(), model_config=str(config)) as running:
        yield running
