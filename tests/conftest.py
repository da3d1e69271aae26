"""Shared fixtures (the reference SavedModels, from the export cache of tests/support/models.py)
and the markers given by place: everything under tests/e2e is `e2e`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import models

E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with version 1 of every reference model (serving.reference:
    four detectors, three classifiers), copied from the export cache (tests/support/models.py;
    exported there first when the cache has none for the current sources).

    Layout: <repo>/<model name>/1/ (SavedModel, assets.extra/ with warmup and label_map.pbtxt
    or labels.txt).
    """
    return models.copy_to(tmp_path_factory.mktemp("models"))
