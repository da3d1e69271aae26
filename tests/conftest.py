"""Shared fixtures: the reference SavedModels, exported once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


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
