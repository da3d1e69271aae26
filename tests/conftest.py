"""Shared fixtures (the reference SavedModels, from the export cache of tests/support/models.py),
the markers given by place (everything under tests/e2e is `e2e`) and the run's last line: what
was skipped and why (under CI=1 a missing tool fails instead: tests/support/tools.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from _pytest.terminal import TerminalReporter

from tests.support import models

E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = Counter(_skip_reason(report) for report in skipped)
    why = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())
    terminalreporter.write_line(f"skipped: {len(skipped)}" + (f" ({why})" if why else ""))


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with version 1 of every reference model (serving.reference:
    four detectors, three classifiers), copied from the export cache (tests/support/models.py;
    exported there first when the cache has none for the current sources).

    Layout: <repo>/<model name>/1/ (SavedModel, assets.extra/ with warmup and label_map.pbtxt
    or labels.txt).
    """
    return models.copy_to(tmp_path_factory.mktemp("models"))
