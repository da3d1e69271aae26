"""The generic task option of the clients' command lines (`--option NAME=VALUE`): typed by the
task's request message, the inverse of what the kubernetes executor writes for runner pods,
and refused by name when it is not the task's."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.api.arguments import option_args, parse_options
from gateway.errors import GatewayError, Kind
from gateway.jobs.runner.__main__ import main as batch_main
from gateway.tasks.builtin import BUILT_IN


def _value(binding, name: str):
    field = binding.request_type.DESCRIPTOR.fields_by_name[name]
    if field.type == field.TYPE_STRING:
        return "polygon"
    if field.type in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
        return 0.25
    if field.type == field.TYPE_BOOL:
        return True
    return 7


@pytest.mark.parametrize("verb", BUILT_IN.verbs)
def test_what_the_executor_writes_reads_back_as_the_same_options(verb: str) -> None:
    binding = BUILT_IN.for_verb(verb)
    options = {name: _value(binding, name) for name in binding.options}
    args = option_args(options)
    assert all(a.startswith("--option=") for a in args) and len(args) == len(options)
    assert parse_options(binding, [a.removeprefix("--option=") for a in args]) == options
    # Each value is one its field holds: the task's request message takes them all.
    binding.request_type(**options)


def test_options_at_their_default_are_left_out_in_name_order() -> None:
    assert option_args({"top_k": 0, "min_score": 0.5, "mask_format": ""}) == [
        "--option=min_score=0.5"
    ]
    assert option_args({"b": 2, "a": "rle"}) == ["--option=a=rle", "--option=b=2"]


@pytest.mark.parametrize(
    ("pair", "says"),
    [
        (
            "top_k=3",
            "top_k is not an option of task detect (its options: min_score, max_detections)",
        ),
        ("min_score", "write NAME=VALUE"),
        ("=1", "write NAME=VALUE"),
        ("min_score=high", "min_score of task detect takes a number"),
        ("max_detections=2.5", "max_detections of task detect takes an integer"),
        ("image=abc", "image is not an option of task detect"),
        ("request_id=x", "request_id is not an option of task detect"),
    ],
)
def test_a_pair_the_task_cannot_take_is_refused_naming_it(pair: str, says: str) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_options(BUILT_IN.for_verb("detect"), [pair])
    assert caught.value.kind is Kind.INVALID_INPUT
    assert says in caught.value.message


def test_an_option_given_twice_is_refused() -> None:
    with pytest.raises(GatewayError, match="min_score is given twice"):
        parse_options(BUILT_IN.for_verb("detect"), ["min_score=0.1", "min_score=0.2"])


def test_a_string_option_keeps_its_text() -> None:
    segment = BUILT_IN.for_verb("segment")
    assert parse_options(segment, ["mask_format=polygon"]) == {"mask_format": "polygon"}


def test_detection_batch_refuses_an_option_set_both_ways_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.png").write_bytes(b"x")
    argv = [str(tmp_path / "in"), str(tmp_path / "out"), "--target=127.0.0.1:1"]
    for extra, says in [
        (["--min-score=0.3", "--option", "min_score=0.4"],
         "--min-score and --option min_score=... both set min_score: give one"),
        (["--option", "top_k=3"], "top_k is not an option of task detect"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exited:  # a usage error, as argparse's own
            batch_main([*argv, *extra])
        assert exited.value.code == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before OUTPUT is touched
