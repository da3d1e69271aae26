"""Every command block of README.md and docs/*.md without a marker runs against the session's
`make run` (the Makefile's own target, on free ports: tests/support/makerun.py), byte for byte
as printed apart from the declared substitutions (tests/support/docworkspace.py), and answers
as the doc shows. A launcher that does not start fails all of them (the make_run fixture
raises with make's output); a block a guide adds runs here by itself, and fails with its
file:line when it cannot.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.support import doccommands, docshapes
from tests.support.doccommands import ROOT, Block
from tests.support.docworkspace import Ports, Workspace, problems, run_block
from tests.support.makerun import MakeRun

pytestmark = pytest.mark.slow

BLOCKS = doccommands.command_blocks("run")
# Blocks that wait for the reference models of issue 43.2 (a keypoint model `pose`, a Mask R-CNN
# `maskrcnn`, an embedder `embedder` in `make run`), by page and a piece of their text: they
# are expected to fail until then, and fail the run as soon as they pass (strict), so that
# this list is emptied the day the models come.
PENDING: dict[tuple[str, str], str] = {}


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    why = [
        reason
        for (page, text), reason in PENDING.items()
        if block.page.name == page and text in block.text
    ]
    return [pytest.mark.xfail(reason=why[0], strict=True)] if why else []


@pytest.fixture(scope="module")
def workspace(make_run: MakeRun, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    ports = Ports(make_run.gateway_port, make_run.http_port, make_run.serving_port,
                  make_run.metrics_port)  # fmt: skip
    return Workspace(tmp_path_factory.mktemp("paste"), make_run.models, ports)


@pytest.mark.parametrize("block", [pytest.param(b, marks=_marks(b), id=str(b)) for b in BLOCKS])
def test_the_block_runs_against_make_run_and_answers_as_shown(
    workspace: Workspace, block: Block
) -> None:
    found = []
    outcomes = []
    for command, outcome in run_block(workspace, block):
        found += problems(block, command, outcome)
        outcomes.append(outcome)
    sample = doccommands.answer_sample(block)
    if sample is not None:
        found += doccommands.answer_misses(sample, outcomes[-1].stdout)
    assert not found, "\n\n".join(found)


def test_the_commands_make_run_prints_run_and_answer(
    make_run: MakeRun, workspace: Workspace
) -> None:
    """The ready-to-paste commands of make run's banner (after "try:"), as printed: its own
    ports and sample pictures, nothing substituted."""
    banner = make_run.banner
    assert "\ntry:\n" in banner, banner
    printed = textwrap.dedent(banner.split("\ntry:\n", 1)[1])
    block = Block(ROOT / "tools" / "devrun.py", 0, "sh", printed, "run", "")
    commands = doccommands.shell_commands(block)
    assert len(commands) >= 4, printed
    found = []
    for command in commands:
        outcome = workspace.run_shell(command.text)
        outcome.values = docshapes.json_values(outcome.stdout) if outcome.stdout.strip() else []
        found += problems(block, command, outcome)
        if not outcome.values:
            found.append(f"make run's banner: {command.text!r} printed no answer")
    assert not found, "\n\n".join(found)
