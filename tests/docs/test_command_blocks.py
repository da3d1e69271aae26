"""The command blocks of README.md and docs/*.md: each is checked one way or another (run
against `make run` unless a marker says otherwise: tests/support/doccommands.py KINDS), and
the checks that need no server: quoted code is in its file, a usage synopsis names only what
the program's --help has, `make` targets resolve. The checker itself is tested here on answers
and excerpts that must fail."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support import doccommands, docshapes
from tests.support.doccommands import ROOT, Block, Command
from tests.support.docworkspace import Outcome, Workspace, problems

TESTS = Path(__file__).resolve().parents[1]


def test_every_marker_is_known_and_marks_a_command_block() -> None:
    assert not doccommands.stray_markers(), "\n".join(doccommands.stray_markers())


def test_no_command_is_in_a_fence_without_a_language() -> None:
    unlabelled = [b.where for b in doccommands.unlabelled_commands()]
    assert not unlabelled, (
        f"label these fences `sh` (or `python`) so that they are run: {unlabelled}"
    )


@pytest.mark.parametrize("kind", sorted(doccommands.KINDS))
def test_every_kind_of_block_has_its_check(kind: str) -> None:
    """Each kind's test takes its blocks from command_blocks(kind): a kind nobody checks
    would leave its blocks unchecked."""
    module = re.search(r"\((tests/\S+\.py)\)", doccommands.KINDS[kind])
    assert module, f"KINDS[{kind!r}] names no test module"
    assert f'command_blocks("{kind}")' in (ROOT / module[1]).read_text()


@pytest.mark.parametrize("block", doccommands.command_blocks(), ids=str)
def test_every_shell_block_splits_into_commands(block: Block) -> None:
    if block.lang in doccommands.SHELL:
        assert doccommands.shell_commands(block), f"{block.where}: no command"


@pytest.mark.parametrize("block", doccommands.command_blocks("excerpt"), ids=str)
def test_quoted_code_is_in_the_file_it_is_quoted_from(block: Block) -> None:
    misses = doccommands.excerpt_misses(block)
    assert not misses, "\n".join(misses)


@pytest.mark.parametrize("block", doccommands.command_blocks("synopsis"), ids=str)
def test_a_synopsis_names_only_what_the_program_offers(block: Block, tmp_path: Path) -> None:
    workspace = Workspace(tmp_path, files=False)
    helps = []
    for command in block.arg.split(";"):
        outcome = workspace.run_shell(command.strip())
        assert outcome.returncode == 0, f"{block.where}: {outcome.report()}"
        helps.append(outcome.stdout)
    for line in doccommands.synopsis_commands(block):
        assert any(line.split()[0] in h for h in helps), f"{block.where}: {line}"
    misses = doccommands.synopsis_misses(block, "\n".join(helps))
    assert not misses, "\n".join(misses)


@pytest.mark.parametrize("block", doccommands.command_blocks("make"), ids=str)
def test_the_make_targets_resolve(block: Block) -> None:
    """`make run` itself is the make_run fixture (tests/support/makerun.py) and `make test` is
    this suite: here each target must exist with everything it needs (`make -n`)."""
    for command in doccommands.shell_commands(block):
        words = command.text.split()
        assert words[0] == "make" and len(words) == 2, f"{block.where}: {command.text}"
        result = subprocess.run(
            ["make", "--no-print-directory", "-n", "-o", ".venv/.installed", words[1]],
            cwd=ROOT, capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, f"{block.where}: make -n {words[1]}: {result.stderr}"


# The checker's own tests: it must fail on what is wrong.

BINDING_BEFORE = """BINDING = Binding.of(
    epb.DESCRIPTOR,
    to_request=to_embed,  # message -> the pipeline's Request
)
"""


def test_an_excerpt_the_code_no_longer_has_fails() -> None:
    page = ROOT / "docs" / "adding-a-task.md"
    block = Block(
        page, 1, "python", BINDING_BEFORE, "excerpt", "gateway/tasks/embedding/binding.py"
    )
    misses = doccommands.excerpt_misses(block)
    assert len(misses) == 1 and "to_request=to_embed" in misses[0]
    moved = Block(page, 1, "python", BINDING_BEFORE, "excerpt", "gateway/tasks/" + "gone.py")
    assert "names no file" in doccommands.excerpt_misses(moved)[0]


def test_a_synopsis_flag_the_program_lacks_fails() -> None:
    block = Block(ROOT / "docs" / "batch.md", 1, "sh", "prog IN [--task detect|pose] [--gone N]\n",
                  "synopsis", "prog --help")  # fmt: skip
    help_text = "usage: prog [--task {detect,classify}] IN\n"
    misses = doccommands.synopsis_misses(block, help_text)
    assert any("--gone" in m for m in misses) and any("pose" in m for m in misses)
    assert not any("detect is" in m for m in misses)


def test_commands_split_as_a_shell_reads_them() -> None:
    text = (
        "# a heading comment\n"
        'curl -s -d \'{"a": 1,\n  "b": 2}\' \\\n  localhost:8080/x   # {"name", ...}\n'
        '# {"more": [...]}\n\n'
        "grpcurl -plaintext localhost:50051 list\n"
    )
    block = Block(ROOT / "README.md", 10, "sh", text, "run", "")
    first, second = doccommands.shell_commands(block)
    assert first.line == 12 and first.text.endswith("localhost:8080/x")
    assert first.shown == '{"name", ...} {"more": [...]}'
    assert (second.line, second.text, second.shown) == (
        17,
        "grpcurl -plaintext localhost:50051 list",
        "",
    )


def test_an_answer_without_the_shown_shape_fails() -> None:
    shape = docshapes.parse(
        '{"instances": [{"keypoints": [{"name": "nose", "x", "y"}, ...]}], "skeleton": [...]} prose'
    )
    assert shape is not None
    good = {"instances": [{"keypoints": [{"name": "a", "x": 1, "y": 2.5}]}], "skeleton": []}
    assert docshapes.mismatches(good, shape) == []
    assert docshapes.mismatches({"instances": [], "skeleton": []}, shape)  # the doc shows one
    no_y = {"instances": [{"keypoints": [{"name": "a", "x": 1}]}], "skeleton": []}
    assert "no key 'y'" in docshapes.mismatches(no_y, shape)[0]
    wrong_type = {"instances": [{"keypoints": [{"name": 3, "x": 1, "y": 2}]}], "skeleton": {}}
    assert len(docshapes.mismatches(wrong_type, shape)) == 2
    assert docshapes.parse("returns when done") is None


def test_an_error_answer_of_curl_fails_though_curl_exits_0() -> None:
    block = Block(ROOT / "docs" / "http.md", 1, "sh", "curl -s x\n", "run", "")
    command = Command("curl -s x", 2, "")
    answer = '{"error": {"code": "NOT_FOUND", "message": "no model"}}'
    outcome = Outcome("curl -s x", 0, answer, "", docshapes.json_values(answer))
    assert "an error answer" in problems(block, command, outcome)[0]
    shown = Command("curl -s x", 2, '{"instances": [...]}')
    assert any("no key 'instances'" in p for p in problems(block, shown, outcome))


def test_every_answer_sample_follows_a_block_that_runs() -> None:
    marked = [
        (page, n)
        for page in doccommands.PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if line.strip() == doccommands.ANSWER_MARKER
    ]
    answered = [
        (b.page, s.line - 1)
        for b in doccommands.command_blocks("run")
        if (s := doccommands.answer_sample(b)) is not None
    ]
    assert len(marked) == len(answered), f"answer markers after no run block: {marked}"


def test_an_output_sample_whose_section_is_gone_fails() -> None:
    text = "model 'm' version 1\n  rollout: x\n"
    sample = Block(ROOT / "docs" / "models.md", 5, "", text, "run", "")
    output = "model 'detector' version 1 (detection): OK\n  input plan: x\n"
    assert doccommands.answer_misses(sample, output) == [
        "models.md:7: no line of the output starts 'rollout:'"
    ]
