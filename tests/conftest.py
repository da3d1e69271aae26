"""Shared fixtures (the reference SavedModels, exported once per test session) and the
markers given by place: everything under tests/e2e is `e2e`."""

from __future__ import annotations

from pathlib import Path

import pytest

E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with version 1 of every reference model (serving.reference:
    four detectors, three classifiers; about 20 s to export on 2 cores).

    Layout: <repo>/<model name>/1/ (SavedModel, assets.extra/ with warmup and label_map.pbtxt
    or labels.txt).
    """
    from serving.export import export_models

    root = tmp_path_factory.mktemp("models")
    export_models(root, version=1)
    return root
