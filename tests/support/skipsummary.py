"""A pytest plugin (tests/conftest.py loads it): the run ends with one line that counts the skips
by reason, `skipped: 6 (6 x KUBEBUILDER_ASSETS is not set ...)`, so none goes unseen. Under
CI=1 a missing tool fails its test instead of skipping it (tests/support/tools.py)."""

from __future__ import annotations

from collections import Counter

import pytest
from _pytest.terminal import TerminalReporter


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = Counter(_skip_reason(report) for report in skipped)
    why = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())
    terminalreporter.write_line(f"skipped: {len(skipped)}" + (f" ({why})" if why else ""))
