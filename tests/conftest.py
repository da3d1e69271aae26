"""Shared fixtures: the reference SavedModels, exported once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with version 1 of `detector` and `detector_encoded`.

    Layout: <repo>/<model name>/1/ (SavedModel, assets.extra/ with label map and warmup).
    """
    from serving.export import export_models

    root = tmp_path_factory.mktemp("models")
    export_models(root, version=1)
    return root
